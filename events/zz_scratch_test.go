package events_test

import (
	"testing"

	"github.com/toolbatch/toolbatch/events"
)

func TestScratchHuge(t *testing.T) {
	_, err := events.DecodeCommit([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, nil)
	t.Logf("err=%v", err)
}
