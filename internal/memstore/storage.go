package memstore

import (
	"bytes"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// The storage commands. Each checks the size first, as memcached allocates the new item
// before it looks at the old one: a value that can never fit is StatusTooLarge whatever the
// key's state.

func (s *Store) handleSet(req *protocol.Request, r *protocol.Response, now int64) {
	s.stats.cmdSet++
	if !s.fitsFlags(len(req.Key), len(req.Value), req.Flags) {
		// memcached drops the old value when a set fails for size, so that a reader never
		// sees a value older than one the client tried to replace.
		if it := s.items[string(req.Key)]; it != nil {
			s.remove(it)
		}
		r.Status = protocol.StatusTooLarge
		return
	}
	s.store(req, s.lookup(req.Key, now), r, now)
}

// beginStore counts a storage command and finds the item it would replace: ok false when
// the value can never fit, answered StatusTooLarge.
func (s *Store) beginStore(req *protocol.Request, r *protocol.Response, now int64) (it *item, ok bool) {
	s.stats.cmdSet++
	if !s.fitsFlags(len(req.Key), len(req.Value), req.Flags) {
		r.Status = protocol.StatusTooLarge
		return nil, false
	}
	return s.lookup(req.Key, now), true
}

func (s *Store) handleAdd(req *protocol.Request, r *protocol.Response, now int64) {
	if req.Cas != 0 {
		// A binary add with a cas is a cas, as in memcached's process_bin_update.
		s.handleCas(req, r, now)
		return
	}
	it, ok := s.beginStore(req, r, now)
	if !ok {
		return
	}
	if it != nil {
		// A failed add still counts as a use of the item, as memcached's does.
		s.update(it)
		r.Status = notStored(req, protocol.StatusExists)
		return
	}
	s.store(req, nil, r, now)
}

func (s *Store) handleReplace(req *protocol.Request, r *protocol.Response, now int64) {
	if req.Cas != 0 {
		s.handleCas(req, r, now)
		return
	}
	it, ok := s.beginStore(req, r, now)
	if !ok {
		return
	}
	if it == nil {
		r.Status = notStored(req, protocol.StatusNotFound)
		return
	}
	s.store(req, it, r, now)
}

// handleCas stores only over an item whose cas unique is req.Cas. A zero req.Cas matches
// nothing, as in memcached.
func (s *Store) handleCas(req *protocol.Request, r *protocol.Response, now int64) {
	it, ok := s.beginStore(req, r, now)
	if !ok {
		return
	}
	switch {
	case it == nil:
		s.stats.casMisses++
		r.Status = protocol.StatusNotFound
	case it.cas != req.Cas:
		s.stats.casBadval++
		r.Status = protocol.StatusExists
	default:
		s.stats.casHits++
		s.store(req, it, r, now)
	}
}

// handleConcat appends or prepends to an existing value, keeping its flags and exptime.
func (s *Store) handleConcat(req *protocol.Request, r *protocol.Response, now int64) {
	it, ok := s.beginStore(req, r, now)
	if !ok {
		return
	}
	switch {
	case it == nil:
		// Even with a cas, memcached answers NOT_STORED here (binary too), not NOT_FOUND.
		r.Status = protocol.StatusNotStored
		return
	case req.Cas != 0 && it.cas != req.Cas:
		r.Status = protocol.StatusExists
		return
	case !s.fitsFlags(len(it.key), len(it.value)+len(req.Value), it.flags):
		// memcached fails to allocate the combined item and answers NOT_STORED.
		r.Status = protocol.StatusNotStored
		return
	}
	v := make([]byte, 0, len(it.value)+len(req.Value))
	if req.Op == protocol.OpAppend {
		v = append(append(v, it.value...), req.Value...)
	} else {
		v = append(append(v, req.Value...), it.value...)
	}
	it = s.put(req.Key, it, v, it.flags, it.exptime, now)
	r.Cas = it.cas
}

// store puts a copy of req.Value under req.Key and answers STORED with the new cas unique.
func (s *Store) store(req *protocol.Request, old *item, r *protocol.Response, now int64) {
	it := s.put(req.Key, old, bytes.Clone(req.Value), req.Flags, expiryAt(req.Exptime, now), now)
	r.Cas = it.cas
}

// notStored is the answer to an add on a present key or a replace on a missing one: text
// NOT_STORED, but the binary protocol's specific status (memcached's complete_update_bin
// answers KEY_EEXISTS and KEY_ENOENT), so that a binary client sees what memcached sends.
func notStored(req *protocol.Request, binary protocol.Status) protocol.Status {
	if req.Binary {
		return binary
	}
	return protocol.StatusNotStored
}

func (s *Store) handleDelete(req *protocol.Request, r *protocol.Response, now int64) {
	it := s.lookup(req.Key, now)
	switch {
	case it == nil:
		s.stats.deleteMisses++
		r.Status = protocol.StatusNotFound
	case req.Cas != 0 && it.cas != req.Cas:
		r.Status = protocol.StatusExists
	default:
		s.stats.deleteHits++
		s.remove(it)
	}
}

// handleTouch sets a new exptime without modifying the item, so its cas unique stays, as in
// memcached.
func (s *Store) handleTouch(req *protocol.Request, r *protocol.Response, now int64) {
	s.stats.cmdTouch++
	it := s.lookup(req.Key, now)
	if it == nil {
		s.stats.touchMisses++
		r.Status = protocol.StatusNotFound
		return
	}
	s.stats.touchHits++
	s.touch(it, req.Exptime, now)
}

// touch gives it a new exptime and makes it the most recently used; a touch into the past
// removes it.
func (s *Store) touch(it *item, exptime, now int64) {
	it.exptime = expiryAt(exptime, now)
	if it.expired(now) {
		s.remove(it)
		return
	}
	s.bump(it)
}
