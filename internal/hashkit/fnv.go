package hashkit

const (
	fnv64Init  = 0xcbf29ce484222325
	fnv64Prime = 0x100000001b3
	fnv32Init  = 2166136261
	fnv32Prime = 16777619
)

// FNV1_64 is twemproxy's fnv1_64: 64-bit FNV-1 over sign-extended bytes, truncated to its
// low 32 bits.
func FNV1_64(key []byte) uint32 {
	h := uint64(fnv64Init)
	for _, b := range key {
		h *= fnv64Prime
		h ^= uint64(int64(int8(b)))
	}
	return uint32(h)
}

// FNV1a_64 is twemproxy's fnv1a_64, its default hash. Despite the name twemproxy computes
// it in 32 bits, with the 64-bit offset basis and prime truncated to 32 bits, over
// sign-extended bytes; that is what this reproduces.
func FNV1a_64(key []byte) uint32 {
	h := uint32(fnv64Init & 0xffffffff)
	for _, b := range key {
		h ^= signed(b)
		h *= uint32(fnv64Prime & 0xffffffff)
	}
	return h
}

// FNV1_32 is twemproxy's fnv1_32: 32-bit FNV-1 over sign-extended bytes.
func FNV1_32(key []byte) uint32 {
	h := uint32(fnv32Init)
	for _, b := range key {
		h *= fnv32Prime
		h ^= signed(b)
	}
	return h
}

// FNV1a_32 is twemproxy's fnv1a_32: 32-bit FNV-1a over sign-extended bytes.
func FNV1a_32(key []byte) uint32 {
	h := uint32(fnv32Init)
	for _, b := range key {
		h ^= signed(b)
		h *= fnv32Prime
	}
	return h
}
