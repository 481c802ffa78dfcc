package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/protocol"
)

// TestReadOrdered reads a real JetStream stream: every message in order,
// one subject, from a sequence, up to a sequence that must be reached, and
// stopped early by the callback.
func TestReadOrdered(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := protocol.Names{Prefix: "rt"}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n.EventsStream(), Subjects: n.StreamSubjects(protocol.StreamEvents)}); err != nil {
		t.Fatal(err)
	}
	read := func(opt protocol.ReadOptions, stopAt uint64) ([]string, error) {
		var got []string
		err := protocol.ReadOrdered(ctx, js, n.EventsStream(), opt, func(m jetstream.Msg, meta *jetstream.MsgMetadata) error {
			got = append(got, fmt.Sprintf("%d:%s", meta.Sequence.Stream, m.Data()))
			if meta.Sequence.Stream == stopAt {
				return protocol.ErrStopRead
			}
			return nil
		})
		return got, err
	}
	if got, err := read(protocol.ReadOptions{}, 0); err != nil || len(got) != 0 {
		t.Fatalf("an empty stream: %v %v", got, err)
	}
	for i, run := range []string{"a", "b", "a", "b", "a"} {
		if _, err := js.Publish(ctx, n.Events(run), []byte(fmt.Sprint(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		opt    protocol.ReadOptions
		stopAt uint64
		want   []string
		err    error
	}{
		{"all", protocol.ReadOptions{}, 0, []string{"1:1", "2:2", "3:3", "4:4", "5:5"}, nil},
		{"one subject", protocol.ReadOptions{Subjects: []string{n.Events("b")}}, 0, []string{"2:2", "4:4"}, nil},
		{"from a sequence", protocol.ReadOptions{Subjects: []string{n.Events("a")}, FromSeq: 2}, 0, []string{"3:3", "5:5"}, nil},
		{"up to a sequence", protocol.ReadOptions{Subjects: []string{n.Events("a")}, UpTo: 3}, 0, []string{"1:1", "3:3"}, nil},
		{"stopped", protocol.ReadOptions{}, 2, []string{"1:1", "2:2"}, nil},
		{"past the subject's end", protocol.ReadOptions{Subjects: []string{n.Events("b")}, UpTo: 5}, 0, []string{"2:2", "4:4"}, protocol.ErrEndedEarly},
		{"no such subject, a sequence to reach", protocol.ReadOptions{Subjects: []string{n.Events("c")}, UpTo: 1}, 0, nil, protocol.ErrEndedEarly},
		{"no such subject", protocol.ReadOptions{Subjects: []string{n.Events("c")}}, 0, nil, nil},
	} {
		got, err := read(c.opt, c.stopAt)
		if !slices.Equal(got, c.want) || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: got %v %v, want %v %v", c.name, got, err, c.want, c.err)
		}
	}
}
