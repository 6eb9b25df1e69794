package handover

import (
	"fmt"
	"os"
)

// Await receives the next message and returns it when it is an M, with its descriptors.
// A Fail is returned as the error; any other message is an error too, and its descriptors
// are closed.
func Await[M Message](ch *Channel) (M, []*os.File, error) {
	var zero M
	m, files, err := ch.Recv()
	if err != nil {
		return zero, nil, err
	}
	switch m := m.(type) {
	case M:
		return m, files, nil
	case Fail:
		return zero, nil, m
	}
	closeAll(files)
	return zero, nil, fmt.Errorf("handover: got %T, want %T", m, zero)
}

// SendConns hands connections over in batches, each of at most batch connections (MaxFDs
// when batch is not within 1..MaxFDs) and MaxConnsBytes, and waits for each batch's Ack
// before sending the next. files[i] is records[i]'s connection. It returns how many
// connections were acknowledged: the successor owns records[:acked] and the caller closes
// its descriptors of them; the rest are still the caller's to serve. It closes no file, and
// it does not send Done: connections may go in several calls.
func SendConns(ch *Channel, records []ConnRecord, files []*os.File, batch int) (acked int, err error) {
	if len(records) != len(files) {
		return 0, fmt.Errorf("handover: %d connection records for %d descriptors", len(records), len(files))
	}
	if batch < 1 || batch > MaxFDs {
		batch = MaxFDs
	}
	for acked < len(records) {
		end, size := acked, 2 // 2: the record count
		for end < len(records) && end-acked < batch {
			s := connRecordSize(&records[end])
			if end > acked && size+s > MaxConnsBytes {
				break
			}
			size += s
			end++
		}
		if err := ch.Send(Conns{Conns: records[acked:end]}, files[acked:end]); err != nil {
			return acked, err
		}
		ack, _, err := Await[Ack](ch)
		if err != nil {
			return acked, err
		}
		if ack.Count != end-acked {
			return acked, fmt.Errorf("handover: ack of %d connections, %d sent", ack.Count, end-acked)
		}
		acked = end
	}
	return acked, nil
}

// RecvConns receives batches of connections until Done, calling handle with each and
// acknowledging the batch once handle returns nil. handle owns the records and the files
// from its call on, whatever it returns. When handle fails, RecvConns sends Fail with its
// reason and returns its error; a Fail from the sender is returned as the error.
func RecvConns(ch *Channel, handle func([]ConnRecord, []*os.File) error) error {
	for {
		m, files, err := ch.Recv()
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case Done:
			return nil
		case Fail:
			return m
		case Conns:
			if err := handle(m.Conns, files); err != nil {
				// Best effort: the error returned is handle's either way.
				reason := err.Error()
				_ = ch.Send(Fail{Reason: reason[:min(len(reason), maxControlBytes)]}, nil)
				return err
			}
			if err := ch.Send(Ack{Count: len(m.Conns)}, nil); err != nil {
				return err
			}
		default:
			closeAll(files)
			return fmt.Errorf("handover: got %T, want Conns or Done", m)
		}
	}
}
