package protocol

// DataBytes is the bytes r refers to that Own copies: its keys, value, stats arguments and
// meta tokens.
func (r *Request) DataBytes() int {
	n := len(r.Key) + len(r.Value) + len(r.Args) + len(r.Meta.KeyToken)
	for _, k := range r.Keys {
		n += len(k)
	}
	for _, f := range r.Meta.Flags {
		n += len(f.Token)
	}
	return n
}

// Own copies every byte r refers to — its key or keys, value, stats arguments, meta key
// token and flag tokens — appending them to *data, its keys to *keys and its meta flags to
// *flags, and points r at the copies: r then no longer refers to the buffer it was decoded
// from. The three only grow by appending, so copies made into them before stay intact: one
// buffer can hold several requests. This is the one copy of a request, for whatever
// outlives the decoder's buffer (a pipelined request, a background write).
func (r *Request) Own(data *[]byte, keys *[][]byte, flags *[]MetaFlag) {
	r.Key, r.Value, r.Args = take(data, r.Key), take(data, r.Value), take(data, r.Args)
	if len(r.Keys) > 0 {
		first := len(*keys)
		for _, k := range r.Keys {
			*keys = append(*keys, take(data, k))
		}
		r.Keys = (*keys)[first:len(*keys):len(*keys)]
	}
	if m := &r.Meta; r.Op.IsMeta() {
		m.KeyToken = take(data, m.KeyToken)
		first := len(*flags)
		for _, f := range m.Flags {
			*flags = append(*flags, MetaFlag{Letter: f.Letter, Token: take(data, f.Token)})
		}
		m.Flags = (*flags)[first:len(*flags):len(*flags)]
	}
}

// take appends b to *d and returns the copy. nil stays nil.
func take(d *[]byte, b []byte) []byte {
	if b == nil {
		return nil
	}
	start := len(*d)
	*d = append(*d, b...)
	return (*d)[start:len(*d):len(*d)]
}
