// Package doccheck holds tests that keep the docs true to the code and to
// their measurements: the README's package table matches `go list ./...`,
// every performance figure it quotes is a number of docs/BENCHMARKS.md's
// tables, every table of BENCHMARKS.md lies between the markers
// benchmarks/regen.sh rewrites and opens with its date, commit, machine
// and command, and the docs' snippets compile. It has no code of its own.
package doccheck
