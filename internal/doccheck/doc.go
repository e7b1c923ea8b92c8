// Package doccheck holds tests that keep the README true to the code and to
// docs/BENCHMARKS.md: its package table matches `go list ./...`, and every
// performance figure it quotes is a number of BENCHMARKS.md's tables, with
// the command and the date beside it. It has no code of its own.
package doccheck
