package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ExitError is an error with its exit status.
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// Errorf is an ExitError with status code and a formatted message.
func Errorf(code int, format string, args ...any) error {
	return &ExitError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Status is the exit status a command ends with after err, and err's
// message on one line. Nil is status 0; flag.ErrHelp prints usage to
// stdout and is status 0 too; an ExitError has its own status; any other
// error has status other.
func Status(err error, other int, usage string, stdout io.Writer) (code int, msg string) {
	if err == nil {
		return 0, ""
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return 0, ""
	}
	code = other
	var ee *ExitError
	if errors.As(err, &ee) {
		code = ee.Code
	}
	return code, OneLine(err.Error())
}

// OneLine folds a message onto one line.
func OneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// Parse parses args into fs, which takes no arguments. On -h or -help it
// prints fs's defaults to stderr and says done, with no error: the command
// has nothing more to do.
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer) (done bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return true, nil
		}
		return true, err
	}
	if fs.NArg() > 0 {
		return true, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return false, nil
}
