// Command fleetrate runs the fleetrate demos, simulations, benchmarks and
// the rate-limit service. Run "fleetrate help" for the commands.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is how main reports err: prefixed "fleetrate: " once, even
// when the error (as every fleetrate.ErrInvalid does) already starts so.
func errorLine(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "fleetrate: ") {
		return msg
	}
	return "fleetrate: " + msg
}

// run builds the command tree and executes it with args, reading the
// environment only through getenv.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	root := &cobra.Command{
		Use:           "fleetrate",
		Short:         "Share one rate allowance across a fleet of workers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(
		newDemoCmd(),
		newSimulateCmd(),
		serveCommand(getenv),
		newBenchCmd(),
	// subcommands: one constructor per file (demo.go, simulate.go, serve.go, bench.go)
	)
	return root.ExecuteContext(ctx)
}
