package events_test

import (
	"strings"
	"testing"
	"bytes"

	"github.com/toolbatch/toolbatch/events"
)

func TestScratch(t *testing.T) {
	for _, n := range []int{63, 64, 65, 66, 67} {
		_, err := events.CanonicalJSON([]byte(strings.Repeat("[", n) + strings.Repeat("]", n)))
		_, err2 := events.CanonicalJSON([]byte(strings.Repeat("[", n) +"1"+ strings.Repeat("]", n)))
		var rj events.RawJSON
		err3 := events.Unmarshal(append(bytes.Repeat([]byte{0x91}, n), 0x90), &rj)
		err4 := events.Unmarshal(append(bytes.Repeat([]byte{0x91}, n), 0x01), &rj)
		t.Logf("%d empty:%v scalar:%v | mp empty:%v scalar:%v", n, err, err2, err3, err4)
	}
}
