// Package protocol is memcached's wire format, text and binary: the request and response
// values both sides of the proxy share, and codecs that are plain functions over bytes with
// no I/O beyond the bufio.Reader they are given.
package protocol

// Op is a memcached command, the same for both protocols.
type Op uint8

// The commands. Binary quiet variants map to the same Op with Request.Quiet set; binary
// getk/getkq/gatk/gatkq set Request.WithKey; a binary set/replace/append/prepend/delete with
// a non-zero cas compares it, as text cas does (a binary set with cas is OpCas).
const (
	OpInvalid Op = iota
	OpGet
	OpGets
	OpGat
	OpGats
	OpSet
	OpAdd
	OpReplace
	OpAppend
	OpPrepend
	OpCas
	OpDelete
	OpIncr
	OpDecr
	OpTouch
	OpFlushAll
	OpVersion
	OpVerbosity
	OpStats
	OpQuit
	OpNoop
	OpMetaNoop       // mn
	OpMetaGet        // mg
	OpMetaSet        // ms
	OpMetaDelete     // md
	OpMetaArithmetic // ma
	OpMetaDebug      // me: an item's metadata
	OpCacheMemlimit  // cache_memlimit <megabytes>: every server's memory limit
	OpSaslListMechs  // binary SASL list mechs: the mechanisms a client may authenticate with
	OpSaslAuth       // binary SASL auth: Key is the mechanism, Value its first message
	OpSaslStep       // binary SASL step: the next message of a multi-step mechanism
	numOps
)

var opNames = [numOps]string{
	OpInvalid:   "invalid",
	OpGet:       "get",
	OpGets:      "gets",
	OpGat:       "gat",
	OpGats:      "gats",
	OpSet:       "set",
	OpAdd:       "add",
	OpReplace:   "replace",
	OpAppend:    "append",
	OpPrepend:   "prepend",
	OpCas:       "cas",
	OpDelete:    "delete",
	OpIncr:      "incr",
	OpDecr:      "decr",
	OpTouch:     "touch",
	OpFlushAll:  "flush_all",
	OpVersion:   "version",
	OpVerbosity: "verbosity",
	OpStats:     "stats",
	OpQuit:      "quit",
	OpNoop:      "noop",

	OpMetaNoop:       "mn",
	OpMetaGet:        "mg",
	OpMetaSet:        "ms",
	OpMetaDelete:     "md",
	OpMetaArithmetic: "ma",
	OpMetaDebug:      "me",

	OpCacheMemlimit: "cache_memlimit",

	OpSaslListMechs: "sasl_list_mechs",
	OpSaslAuth:      "sasl_auth",
	OpSaslStep:      "sasl_step",
}

// String is the lower-case memcached command name, as used in metric labels.
func (op Op) String() string {
	if op >= numOps {
		return "invalid"
	}
	return opNames[op]
}

// NumOps is one more than the largest Op, for tables indexed by Op.
const NumOps = int(numOps)

// IsRetrieval reports whether op is get, gets, gat or gats: the commands that carry
// Request.Keys and answer one Response per key.
func (op Op) IsRetrieval() bool { return op >= OpGet && op <= OpGats }

// IsStorage reports whether op stores a value (set, add, replace, append, prepend, cas).
func (op Op) IsStorage() bool { return op >= OpSet && op <= OpCas }

// IsWrite reports whether op changes one key: a storage command, delete, incr, decr or touch.
func (op Op) IsWrite() bool { return op >= OpSet && op <= OpTouch }

// ChangesKey reports whether op writes its key: the write commands, and the meta commands
// but mg and the ones without a key. (An mg with N or T changes the item too, but never to
// a value older than the one it holds.)
func (op Op) ChangesKey() bool {
	return op.IsWrite() || op == OpMetaSet || op == OpMetaDelete || op == OpMetaArithmetic
}

// Repeatable reports whether a request may be sent again when the server did not answer
// it: repeating it cannot change its outcome. A write that may already have been applied
// is not: incr/decr/append/prepend would apply twice, add and cas would report a failure
// for their own success, and a meta write's modes, cas, invalidation and vivification make
// any of them unsafe to repeat.
func (op Op) Repeatable() bool {
	switch op {
	case OpIncr, OpDecr, OpAppend, OpPrepend, OpAdd, OpCas, OpMetaSet, OpMetaDelete, OpMetaArithmetic:
		return false
	}
	return true
}

// IsMeta reports whether op is a meta command (mn mg ms md ma me). Meta commands carry
// Request.Meta and answer one Response with Response.Meta; IsRetrieval, IsStorage and
// IsWrite are false for them.
func (op Op) IsMeta() bool { return op >= OpMetaNoop && op <= OpMetaDebug }

// IsSASL reports whether op is one of the binary SASL commands, which the connection
// answers itself (clients authenticate to moxi, not to its servers).
func (op Op) IsSASL() bool { return op >= OpSaslListMechs && op <= OpSaslStep }

// Request is one decoded client request. Byte slices point into the decoder's buffers and
// are valid only until the next decode on the same connection: whatever keeps them longer
// (a cache, a queue, a store) copies them first.
type Request struct {
	Op Op

	// Key is the key of a single-key command. Retrieval commands use Keys instead (one key
	// for binary, one or more for text), never Key.
	Key  []byte
	Keys [][]byte

	Value   []byte // storage commands: the data block, without its trailing "\r\n"
	Flags   uint32 // storage commands: client flags
	Exptime int64  // storage, touch, gat: expiry as sent (see memcached's rules); flush_all: delay
	Cas     uint64 // cas, gets-less compare for binary; 0 means none
	Delta   uint64 // incr/decr amount; cache_memlimit: the limit in megabytes
	Initial uint64 // binary incr/decr: value stored when the key is missing and Create is set
	Create  bool   // binary incr/decr: create the key with Initial when missing (exptime != 0xffffffff)
	Level   uint32 // verbosity level
	Args    []byte // stats: the argument line after "stats " (text) or the key (binary), e.g. "proxy"

	// Text protocol: noreply was given, so nothing is written back (not even errors).
	NoReply bool

	// Binary protocol fields, echoed in the response.
	Binary  bool
	Opcode  uint8  // the request's opcode, answered with the same one
	Opaque  uint32 // copied into the response unchanged
	Quiet   bool   // quiet opcode: success (get: miss) answers are suppressed
	WithKey bool   // getk/getkq/gatk/gatkq: the key is returned with the value

	// Meta commands: the flags and what they mean. Key is the decoded key (base64-decoded
	// under the b flag) and, for ms, Value the data block.
	Meta MetaRequest

	// Namespace is the length of the namespace ("<user>:", auth.namespaces) in front of
	// every key of the request, which the client did not send: answers carry each key
	// without it. 0: none.
	Namespace int
}

// ClientKey is key as req's client named it: without req's namespace.
func (r *Request) ClientKey(key []byte) []byte {
	if r.Namespace > 0 && len(key) >= r.Namespace {
		return key[r.Namespace:]
	}
	return key
}

// Reset clears r for reuse, keeping the capacity of its Keys and Meta.Flags slices.
func (r *Request) Reset() {
	keys := r.Keys[:0]
	flags := r.Meta.Flags[:0]
	*r = Request{Keys: keys}
	r.Meta.Flags = flags
}

// Status is the outcome of a request that the server answered. A miss, an existing key or a
// failed add are statuses, not Go errors: an error means the server did not answer at all.
type Status uint8

// The statuses, named after memcached's binary status codes.
const (
	StatusOK             Status = iota // hit, STORED, DELETED, TOUCHED, OK, a number, a version
	StatusNotFound                     // miss, NOT_FOUND
	StatusExists                       // EXISTS: cas mismatch
	StatusNotStored                    // NOT_STORED: add on a present key, replace/append/prepend on a missing one
	StatusNonNumeric                   // incr/decr on a value that is not a decimal number
	StatusTooLarge                     // value larger than the limit
	StatusInvalid                      // CLIENT_ERROR <Msg>: the request was malformed
	StatusNoMemory                     // SERVER_ERROR out of memory storing object
	StatusUnknownCommand               // ERROR
	StatusTempFailure                  // SERVER_ERROR <Msg>: no server could answer
	StatusAuthError                    // CLIENT_ERROR <Msg> (binary: "Auth failure."): a command the proxy is set to refuse, as memcached -F refuses flush_all
)

// Binary status codes (memcached's protocol_binary.h).
const (
	BinStatusOK             uint16 = 0x0000
	BinStatusNotFound       uint16 = 0x0001
	BinStatusExists         uint16 = 0x0002
	BinStatusTooLarge       uint16 = 0x0003
	BinStatusInvalid        uint16 = 0x0004
	BinStatusNotStored      uint16 = 0x0005
	BinStatusNonNumeric     uint16 = 0x0006
	BinStatusAuthError      uint16 = 0x0020
	BinStatusUnknownCommand uint16 = 0x0081
	BinStatusNoMemory       uint16 = 0x0082
	BinStatusNotSupported   uint16 = 0x0083
	BinStatusInternal       uint16 = 0x0084
	BinStatusBusy           uint16 = 0x0085
	BinStatusTempFailure    uint16 = 0x0086
)

// BinaryStatus is s as a binary-protocol status code.
func (s Status) BinaryStatus() uint16 {
	switch s {
	case StatusOK:
		return BinStatusOK
	case StatusNotFound:
		return BinStatusNotFound
	case StatusExists:
		return BinStatusExists
	case StatusNotStored:
		return BinStatusNotStored
	case StatusNonNumeric:
		return BinStatusNonNumeric
	case StatusTooLarge:
		return BinStatusTooLarge
	case StatusInvalid:
		return BinStatusInvalid
	case StatusNoMemory:
		return BinStatusNoMemory
	case StatusUnknownCommand:
		return BinStatusUnknownCommand
	case StatusAuthError:
		return BinStatusAuthError
	default:
		return BinStatusTempFailure
	}
}

// StatusFromBinary is the Status for a binary-protocol status code; codes moxi does not
// distinguish become StatusTempFailure.
func StatusFromBinary(code uint16) Status {
	switch code {
	case BinStatusOK:
		return StatusOK
	case BinStatusNotFound:
		return StatusNotFound
	case BinStatusExists:
		return StatusExists
	case BinStatusNotStored:
		return StatusNotStored
	case BinStatusNonNumeric:
		return StatusNonNumeric
	case BinStatusTooLarge:
		return StatusTooLarge
	case BinStatusInvalid:
		return StatusInvalid
	case BinStatusNoMemory:
		return StatusNoMemory
	case BinStatusUnknownCommand:
		return StatusUnknownCommand
	default:
		return StatusTempFailure
	}
}

// Response is a server's answer to one request, or to one key of a retrieval.
// Value bytes are never modified by anyone once returned: a store may hand out its own
// immutable item bytes, and a receiver that keeps them past the request copies nothing.
type Response struct {
	Status Status
	Key    []byte // retrievals: the key this answer is for
	Value  []byte // retrieval hits: the data; version: the version string; stats: a one-line answer (OK, RESET) given instead of STAT lines
	Flags  uint32
	Cas    uint64
	Number uint64     // incr/decr: the new value
	Msg    string     // StatusInvalid, StatusTempFailure: the reason shown to the client
	Stats  []Stat     // stats: the lines, in order
	Meta   MetaAnswer // meta commands: the answer code and return flags
}

// Stat is one "STAT name value" line.
type Stat struct {
	Name, Value string
}

// Limits bound what a decoder accepts before it allocates anything.
// The zero value is not useful; DefaultLimits has the documented defaults.
type Limits struct {
	MaxKeyBytes     int // longest key (memcached: 250)
	MaxValueBytes   int // longest data block
	MaxMultigetKeys int // keys in one get/gets/gat/gats line
	MaxLineBytes    int // longest text command line other than a retrieval (memcached: 2048)
}

// MaxKeyLength is memcached's own limit on a key's length, and the default limit.
const MaxKeyLength = 250

// DefaultLimits are the documented defaults (the config's limits start from them).
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:     MaxKeyLength,
		MaxValueBytes:   1 << 20,
		MaxMultigetKeys: 10000,
		MaxLineBytes:    2048,
	}
}

// RequestError is a request the decoder rejected. The codec renders it as memcached would
// (text: "ERROR", "CLIENT_ERROR <Msg>" or "SERVER_ERROR <Msg>"; binary: the status with Msg
// as body), and Close says whether memcached would then close the connection (after writing
// the answer). Any other decoder error is an I/O error and the connection is closed silently.
type RequestError struct {
	Status Status // StatusUnknownCommand, StatusInvalid or StatusTooLarge
	Msg    string
	Close  bool
	// Unlink is the key of a set rejected for its size: memcached then unlinks the item
	// under it, so that no value older than the failed write stays readable. Valid until
	// the next Read.
	Unlink []byte
	// Line, when set, is memcached's whole text answer where it follows none of the
	// forms above ("ERROR: shutdown not enabled", "MEMLIMIT_TOO_SMALL …").
	Line string
}

func (e *RequestError) Error() string {
	switch e.Status {
	case StatusUnknownCommand:
		return "ERROR"
	case StatusTooLarge, StatusNoMemory, StatusTempFailure:
		return "SERVER_ERROR " + e.Msg
	default:
		return "CLIENT_ERROR " + e.Msg
	}
}
