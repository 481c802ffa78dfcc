package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// LogFlags are the logging flags every program has.
type LogFlags struct {
	format, level string
}

// Flags adds --log-format and --log-level to fs.
func (l *LogFlags) Flags(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "console", "console or json")
	fs.StringVar(&l.level, "log-level", "info", "debug, info, warn or error")
}

// Logger is the logger the flags ask for, writing to w: the console format
// is coloured only on a terminal (a log redirected to a file is plain
// text).
func (l *LogFlags) Logger(w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(l.level)
	if err != nil || l.level == "" || lvl > zerolog.ErrorLevel || lvl < zerolog.DebugLevel {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	switch l.format {
	case "json":
		return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
	case "console":
		cw := zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339, NoColor: !terminal(w)}
		return zerolog.New(cw).Level(lvl).With().Timestamp().Logger(), nil
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want console or json", l.format)
	}
}

// terminal reports whether w is a terminal.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
