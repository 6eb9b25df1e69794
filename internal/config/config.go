// Package config reads moxi's YAML topology file into a validated Config with every
// default filled in.
//
// The file format is documented key by key in docs/configuration.md. Parsing goes
// through yaml.Node rather than struct tags so that an unknown key, a bad value or a
// dangling reference is reported with the file, the line and the field path
// ("moxi.yaml:14: pools.main.conections: unknown key"), and so that an absent key can be
// told from an explicit false or zero. An explicit null (`key:` with no value) counts as
// absent and leaves the default.
//
// The rest of the package serves what surrounds a loaded Config: Config.YAML writes it
// back out for --check and GET /config, Diff tells a reload what changed, and Default and
// NewPool hand other packages the documented defaults.
package config

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
	"github.com/moxi-proxy/moxi/internal/tlsfiles"
)

// Config is one loaded topology. Parse and Default return a fresh value that nothing else
// references; the proxy treats it as immutable once built, so sharing it between goroutines
// for reading is safe.
type Config struct {
	Listen          string        // client address: host:port (host may be empty: all interfaces), or a Unix socket's path (see UnixSocket)
	TLS             *TLS          // TLS on Listen; nil: plaintext
	Listeners       []Listener    // more client ports, each with its own default pool (twemproxy's listen per pool); nil when none
	Admin           string        // HTTP admin address; "" turns the admin server off
	AdminTokenFile  string        // when set: every admin path but /healthz, /readyz and /metrics needs "Authorization: Bearer <its content>"
	AdminToken      []byte        // AdminTokenFile's content, surrounding white space removed, as LoadAdminToken read it; nil before and without a file
	AdminTokenLine  int           // of admin_token_file in the file, for messages; 0 when not from a file
	ShutdownTimeout time.Duration // bound on draining in-flight requests at exit
	// Zone is this proxy's availability zone: the zone a pool with Zones reads first. The
	// process keeps the zone it started with (--zone, then MOXI_ZONE, then this key).
	Zone        string
	Limits      Limits
	WatchConfig bool // reload when the file changes
	// ApplyAt, when set, is when a reload of this file puts it in service (every proxy of a
	// tier at once) instead of at the reload; zero: at once.
	ApplyAt time.Time

	Pools       []*Pool // in file order, each with Name set; never empty after Parse
	DefaultPool string  // pool for keys no route matches; set even when the file omits it
	Routes      []Route // first matching prefix wins; nil when none

	Dedup         bool // coalesce identical concurrent gets
	HotCache      HotCache
	HotKeys       HotKeys
	FireAndForget FireAndForget

	Auth *Auth // clients authenticate first; nil: every client is served

	Readiness Readiness
	Metrics   Metrics
}

// Readiness is what /readyz asks of the pools besides a loaded config and listening.
type Readiness struct {
	// Pools must each have a live server; nil: at least one pool must have one, so that
	// one dead pool does not take the proxy, and the pools that still serve, out of service.
	Pools []string
}

// Metrics bounds the series moxi exports.
type Metrics struct {
	PerServer      bool      // moxi_backend_* series for each server; false: none, only per pool
	LatencyBuckets []float64 // the request-duration histograms' upper bounds in seconds, ascending; nil: the built-in ones (Buckets)
}

// Buckets are the request-duration histograms' buckets: LatencyBuckets, or when it is
// empty the built-in ones, 10 from 100 µs to 1 s (each histogram is 13 series of each
// command, pool and server: 2 pools of 5 servers export under 240 series in all).
func (m Metrics) Buckets() []float64 {
	if len(m.LatencyBuckets) > 0 {
		return m.LatencyBuckets
	}
	return []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .05, .25, 1}
}

// Auth is the auth section: a client must authenticate (binary SASL PLAIN, or the text
// protocol's set of "user password", as memcached -S and -Y) before any other request.
type Auth struct {
	UsersFile  string // lines "user:password", memcached's -Y file form
	Namespaces bool   // each user's keys are stored as "<user>:<key>", invisibly to the user
	Line       int    // of the section in the file, for messages; 0 when not from a file
	// Limits is each user's requests and bytes a second, in file order; an entry for
	// limit.Every gives each user without one of their own those rates. None: no limit.
	Limits []UserLimit

	// Users is UsersFile's content (name → password) as LoadSecrets read it; nil before.
	Users map[string]string
}

// UserLimit is one entry of auth.limits: what one user may send a second through one
// proxy; the user limit.Every ("*") stands for each user without an entry of their own.
type UserLimit struct {
	User         string
	RequestsPerS int // requests, each key of a multi-key get one; 0 = no limit
	BytesPerS    int // keys and values received and sent; 0 = no limit
}

// SASL is a pool's sasl section: its servers require SASL PLAIN (memcached -S), and moxi
// authenticates every connection it opens to them as User.
type SASL struct {
	User         string
	PasswordFile string // the password, surrounding white space removed
	Line         int    // of the section in the file, for messages; 0 when not from a file

	// Password is PasswordFile's content as LoadSecrets read it; nil before.
	Password []byte
}

// Limits bound what one client may ask of the proxy.
type Limits struct {
	MaxConnections  int  // concurrent client connections; further ones are refused
	MaxKeyBytes     int  // 1 to 250, memcached's own maximum
	MaxValueBytes   int  // largest data block accepted
	MaxMultigetKeys int  // keys in one get/gets line
	AllowFlushAll   bool // false: flush_all, binary flush and cache_memlimit are refused, as memcached -F refuses flush_all

	// The byte account of client connections (docs/resource-bounds.md): requests
	// received but not finished and answers not yet written, per connection and in total.
	MaxBufferedBytes   int
	MaxConnectionBytes int
	// MaxBackgroundBytes bounds backup copies and shadow requests queued at once.
	MaxBackgroundBytes int
	RequestTimeout     time.Duration // a request whose first byte arrived must be complete within this
	WriteTimeout       time.Duration // a client must take 64 KiB of its pending answers, or all of them, within this
}

// Pool is one named set of servers sharing a key distribution.
type Pool struct {
	Name         string
	Distribution string   // one of pool.Distributions(): ketama | jump | modula
	Hash         string   // one of hashkit.Names(), twemproxy's hash names, e.g. md5, fnv1a_64
	HashTag      string   // twemproxy's hash_tag: "" or two characters around the part of a key that is hashed
	Servers      []Server // in file order; nil for an embedded pool; with Zones, every zone's, zone by zone
	// Zones, when set, are the pool's zones in listed order: a full copy of the pool in
	// each, a ring of its own (the Servers whose Zone it is). nil: no zones.
	Zones []string
	// ZoneDiscover are the zones whose servers come from discovery, by zone name: their
	// Servers are those discovered (none before the first answer). nil: none.
	ZoneDiscover map[string]*Discover

	Connections    int           // persistent connections per server
	ConnectTimeout time.Duration // per dial
	Timeout        time.Duration // per attempt, per request
	Retries        int           // further attempts after a timeout or connection error
	FailureLimit   int           // consecutive failures that mark a server dead
	DeadBackoff    time.Duration // first wait before probing a dead server
	DeadBackoffMax time.Duration // cap of the doubling probe wait
	Failover       bool          // route a dead server's keys to the next live one
	FailoverTTL    time.Duration // cap on the expiry of writes that land on a stand-in

	Backup           string    // another pool's name, or ""
	Embedded         int       // N > 0: N in-process shards instead of Servers
	Discover         *Discover // the server list comes from DNS instead of the file; nil: Servers
	EmbeddedMemoryMB int       // memory bound of each embedded shard
	MigrateRate      int       // keys/s cap of a migration's background copy; 0 = unlimited

	Replicas    int      // N > 1: each key lives on the N distinct servers that follow it (pool.Replicas)
	WriteQuorum string   // with Replicas: one of replica.WriteQuorums(), the acknowledgements a write waits for
	ReadFrom    string   // with Replicas: one of replica.ReadFroms(), the replica a read asks first
	TLS         *PoolTLS // TLS to the servers; nil: plaintext
	SASL        *SASL    // the servers require SASL PLAIN (and so speak binary only); nil: they do not

	// WarmFrom is another pool's name, or "": a get that misses on this pool is read there,
	// answered and copied here (docs/migration.md). That pool
	// must not have a WarmFrom of its own.
	WarmFrom string
	// Shadow, when set, mirrors the requests of a share of this pool's keys to another pool.
	Shadow *Shadow
}

// Shadow is a pool's shadow section: the requests for Fraction of its keys, chosen by a
// hash of the key, are also sent to Pool, after the client's answer, which the shadow
// pool's answers never change.
type Shadow struct {
	Pool     string  // another pool's name
	Fraction float64 // 0 to 1: the share of keys shadowed
}

// Listener is one more client port: its clients' keys that no route matches go to its
// DefaultPool rather than the config's. Everything else — routes, limits, the connection
// bound counted over every listener — is the config's.
type Listener struct {
	Listen      string // host:port or a Unix socket's path, as Config.Listen
	DefaultPool string // set after Parse: the config's DefaultPool when the file gives none
	TLS         *TLS   // TLS on this port; nil: plaintext. Fields the file leaves out are the top-level tls's
	Line        int    // of the entry in the file, for messages
}

// Discover is a pool's discover section: its servers are the answers of a DNS name, asked
// again every Interval (package discover). Parse leaves the pool's Servers empty; moxi
// fills them from the answers before a config is built.
type Discover struct {
	DNS string // the name: its A/AAAA records, or with SRV its SRV records; "" with ConfigEndpoint
	// ConfigEndpoint, instead of DNS, is the host:port of an ElastiCache or Memorystore
	// configuration endpoint, asked "config get cluster": its nodes are the servers.
	ConfigEndpoint string
	Port           int           // the port of A/AAAA servers
	SRV            bool          // SRV records: ring name = target host name, weight = SRV weight
	Interval       time.Duration // how often the name is resolved again
	RemoveAfter    time.Duration // a server missing from the answers is removed only after this long
	Resolver       string        // host:port of the DNS server to ask; "" = the system's resolver
}

// Source is what d follows, for messages: its DNS name, or its configuration endpoint.
func (d *Discover) Source() string {
	if d.ConfigEndpoint != "" {
		return "config_endpoint " + d.ConfigEndpoint
	}
	return "dns " + d.DNS
}

// TLS is the tls section: TLS on listen, and then only TLS there.
type TLS struct {
	Cert, Key string // PEM files: the certificate chain moxi presents, and its private key
	ClientCA  string // PEM file of the CAs that must have signed clients' certificates; "" = none asked for
	Line      int    // of the section in the file, for messages; 0 when not from a file

	// Config and Sum are what the files held when LoadTLS read them; nil and zero before.
	Config *tls.Config
	Sum    tlsfiles.Sum
}

// PoolTLS is a pool's tls section: TLS to its servers (a migration's old server included).
type PoolTLS struct {
	CA         string // PEM file of the CAs that signed the servers' certificates; "" = the system's roots
	Cert, Key  string // PEM files of a client certificate and its key, for mutual TLS; both or neither
	ServerName string // the name servers' certificates are verified for; "" = the host of each server's address
	Line       int    // of the section in the file, for messages; 0 when not from a file

	// Config and Sum are what the files held when LoadTLS read them; nil and zero before.
	Config *tls.Config
	Sum    tlsfiles.Sum
}

// Server is one backend memcached server of a pool.
type Server struct {
	// Name is the ring identity as given in the file, or "" when none was given: the ring
	// then derives it from Addr the way twemproxy and libmemcached do (see RingName), which
	// keeps key placement compatible with them.
	Name        string
	Addr        string    // host:port, port in canonical decimal form
	Weight      int       // at least 1
	MigrateFrom string    // host:port this slot's data is being moved from, or ""
	MigrateAt   time.Time // when every proxy of a tier switches the slot to the new server; zero: at the reload
	Zone        string    // the zone it is in (Pool.Zones), or ""
	Line        int       // line of the entry in the file, for messages; 0 when not from a file
}

// Route sends keys starting with Prefix to Pool.
type Route struct {
	Prefix, Pool string
}

// HotCache is the proxy-local LRU for keys with one of Prefixes (and, with HotKeys.Cache,
// for the keys found hot). No prefixes: off, unless HotKeys.Cache.
//
// Peers are the other moxi of this tier, by their admin addresses: a write or delete
// acknowledged through this moxi drops the key from their hot caches too (POST /invalidate,
// presenting PeerToken), and theirs from this one's.
type HotCache struct {
	Prefixes []string
	MaxItems int
	MaxBytes int           // keys + values held; past it the least recently used go
	TTL      time.Duration // an entry is never served older than this

	Peers         []string  // admin addresses of the other moxi of this tier
	PeersDiscover *Discover // or: the peers are the answers of a DNS name (port: their admin port); nil: Peers
	PeerTokenFile string
	PeerToken     []byte // PeerTokenFile's content, surrounding white space removed; nil without a file
	PeerTokenLine int    // line of peer_token_file in the file, for messages
}

// HotKeys is the hot_keys section: a sampled count, per pool, of the keys that take most
// of its traffic (GET /hotkeys, moxi_hot_key_share). Enabled false: off.
type HotKeys struct {
	Enabled  bool          // the section is present
	Top      int           // keys reported per pool
	Sample   float64       // fraction of requests counted, in (0, 1]
	Window   time.Duration // the report covers about this much recent time
	MinShare float64       // a key is hot while its share of its pool's requests is at least this (cooled below half of it)
	Cache    bool          // a key found hot is also served from the hot cache (its TTL and bounds), prefix or not
}

// FireAndForget lists the prefixes whose sets are acknowledged at once and written in the
// background. No prefixes: off.
type FireAndForget struct {
	Prefixes        []string
	MaxPending      int // writes queued beyond this wait instead of growing memory
	MaxPendingBytes int // the same bound in bytes of keys + values queued
}

// The documented defaults (docs/configuration.md): moxi's one table of them. Parse starts from them, and other
// packages read them through Default and NewPool rather than repeating the numbers.
const (
	defaultListen          = "127.0.0.1:11211"
	defaultAdmin           = "127.0.0.1:9151"
	defaultShutdownTimeout = 10 * time.Second

	defaultMaxConnections     = 10000
	defaultMaxBufferedBytes   = 64 << 20
	defaultMaxConnectionBytes = 4 << 20
	defaultMaxBackgroundBytes = 64 << 20
	defaultRequestTimeout     = 30 * time.Second
	defaultWriteTimeout       = 30 * time.Second

	defaultDistribution     = pool.DefaultDistribution
	defaultHash             = pool.DefaultHash
	defaultConnections      = 4
	defaultConnectTimeout   = time.Second
	defaultTimeout          = 250 * time.Millisecond
	defaultRetries          = 1
	defaultFailureLimit     = 2
	defaultDeadBackoff      = 100 * time.Millisecond
	defaultDeadBackoffMax   = 10 * time.Second
	defaultDiscoverPort     = 11211
	defaultDiscoverInterval = 10 * time.Second
	defaultRemoveAfter      = 60 * time.Second
	defaultFailoverTTL      = 5 * time.Minute
	defaultEmbeddedMemoryMB = 64

	defaultHotCacheMaxItems = 100000
	defaultHotCacheMaxBytes = 64 << 20
	defaultHotCacheTTL      = 2 * time.Second
	defaultPeersPort        = 9151 // hot_cache.peers_discover.port: admin's default port
	defaultHotKeysTop       = hotkeys.DefaultTop
	defaultHotKeysSample    = hotkeys.DefaultSample
	defaultHotKeysWindow    = hotkeys.DefaultWindow
	defaultHotKeysMinShare  = hotkeys.DefaultMinShare
	defaultMaxPending       = 10000
	defaultMaxPendingBytes  = 64 << 20
)

// newConfig returns the top-level defaults, with no pools.
func newConfig() *Config {
	lim := protocol.DefaultLimits() // the codec's limits are the defaults of the config's
	return &Config{
		Listen:          defaultListen,
		Admin:           defaultAdmin,
		ShutdownTimeout: defaultShutdownTimeout,
		Limits: Limits{
			MaxConnections:  defaultMaxConnections,
			MaxKeyBytes:     lim.MaxKeyBytes,
			MaxValueBytes:   lim.MaxValueBytes,
			MaxMultigetKeys: lim.MaxMultigetKeys,
			AllowFlushAll:   true,

			MaxBufferedBytes:   defaultMaxBufferedBytes,
			MaxConnectionBytes: defaultMaxConnectionBytes,
			MaxBackgroundBytes: defaultMaxBackgroundBytes,
			RequestTimeout:     defaultRequestTimeout,
			WriteTimeout:       defaultWriteTimeout,
		},
		WatchConfig:   true,
		Dedup:         true,
		HotCache:      HotCache{MaxItems: defaultHotCacheMaxItems, MaxBytes: defaultHotCacheMaxBytes, TTL: defaultHotCacheTTL},
		HotKeys:       HotKeys{Top: defaultHotKeysTop, Sample: defaultHotKeysSample, Window: defaultHotKeysWindow, MinShare: defaultHotKeysMinShare},
		FireAndForget: FireAndForget{MaxPending: defaultMaxPending, MaxPendingBytes: defaultMaxPendingBytes},
		Metrics:       Metrics{PerServer: true},
	}
}

// NewPool returns a pool called name with every documented default and neither
// servers nor embedded shards: what Parse starts each pool from, and where other packages
// find a pool setting's default. Each call returns a new Pool.
func NewPool(name string) *Pool {
	return &Pool{
		Name:             name,
		Distribution:     defaultDistribution,
		Hash:             defaultHash,
		Connections:      defaultConnections,
		ConnectTimeout:   defaultConnectTimeout,
		Timeout:          defaultTimeout,
		Retries:          defaultRetries,
		FailureLimit:     defaultFailureLimit,
		DeadBackoff:      defaultDeadBackoff,
		DeadBackoffMax:   defaultDeadBackoffMax,
		Failover:         true,
		FailoverTTL:      defaultFailoverTTL,
		EmbeddedMemoryMB: defaultEmbeddedMemoryMB,
		Replicas:         1,
		WriteQuorum:      replica.QuorumAll,
		ReadFrom:         replica.ReadFirst,
	}
}

// Default is the topology moxi runs without --config: clients on 127.0.0.1:11211, admin on
// 127.0.0.1:9151, and one pool "main" of 2 embedded shards, so that `moxi` alone is a
// working cache. configs/embedded.yaml is the same topology written out. Its top-level
// settings are the documented defaults. Each call returns a new Config.
func Default() *Config {
	c := newConfig()
	p := NewPool("main")
	p.Embedded = 2
	c.Pools = []*Pool{p}
	c.DefaultPool = p.Name
	return c
}

// Pool returns the pool called name, or nil when there is none.
func (c *Config) Pool(name string) *Pool {
	for _, p := range c.Pools {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// load runs each read with one decoder and applies what they read when none failed: on
// error c is left as it was. filename is used only in error messages.
func (c *Config) load(filename string, reads ...func(*decoder) func()) error {
	d := &decoder{file: filename}
	applies := c.readFiles(d, reads...)
	if err := d.err(); err != nil {
		return err
	}
	for _, apply := range applies {
		apply()
	}
	return nil
}

// readFiles runs each read (all of the files c names when none is given) with d.
func (c *Config) readFiles(d *decoder, reads ...func(*decoder) func()) []func() {
	if len(reads) == 0 {
		reads = []func(*decoder) func(){c.readTLS, c.readAdminToken, c.readPeerToken, c.readSecrets}
	}
	applies := make([]func(), len(reads))
	for i, read := range reads {
		applies[i] = read(d)
	}
	return applies
}

// UnixSocket reports whether a listen address is the path of a Unix socket rather than
// host:port: it contains a slash, which no host:port does.
func UnixSocket(listen string) bool { return strings.Contains(listen, "/") }

// LoadTLS reads the certificate, key and CA files that c's tls sections name into their
// Config and Sum, so that a file missing or invalid fails a load like a bad value does.
// Parse leaves them unread (it reads only the file it is given); moxi calls LoadTLS after
// it at every load, so that a reload picks up rotated files. filename is used only in
// error messages, which have Parse's form. On error c is left as it was.
func (c *Config) LoadTLS(filename string) error { return c.load(filename, c.readTLS) }

func (c *Config) readTLS(d *decoder) (apply func()) {
	type loaded struct {
		conf *tls.Config
		sum  tlsfiles.Sum
	}
	var listen loaded
	listeners := make([]loaded, len(c.Listeners))
	pools := make([]loaded, len(c.Pools))
	// A section without its certificate or key was reported by Parse (Read reads what it
	// could of a config with errors too): nothing more to say of it.
	if t := c.TLS; t != nil && t.Cert != "" && t.Key != "" {
		var err error
		listen.conf, listen.sum, err = tlsfiles.Server(t.Cert, t.Key, t.ClientCA)
		d.fileError(t.Line, "tls", err, [][2]string{{"cert", t.Cert}, {"key", t.Key}, {"client_ca", t.ClientCA}})
	}
	for i, l := range c.Listeners {
		if t := l.TLS; t != nil && t.Cert != "" && t.Key != "" {
			var err error
			listeners[i].conf, listeners[i].sum, err = tlsfiles.Server(t.Cert, t.Key, t.ClientCA)
			d.fileError(t.Line, index("listeners", i)+".tls", err, [][2]string{{"cert", t.Cert}, {"key", t.Key}, {"client_ca", t.ClientCA}})
		}
	}
	for i, p := range c.Pools {
		if t := p.TLS; t != nil {
			var err error
			pools[i].conf, pools[i].sum, err = tlsfiles.Client(t.CA, t.Cert, t.Key, t.ServerName)
			d.fileError(t.Line, "pools."+p.Name+".tls", err, [][2]string{{"ca", t.CA}, {"cert", t.Cert}, {"key", t.Key}})
		}
	}
	return func() {
		if c.TLS != nil {
			c.TLS.Config, c.TLS.Sum = listen.conf, listen.sum
		}
		for i, l := range c.Listeners {
			if l.TLS != nil {
				l.TLS.Config, l.TLS.Sum = listeners[i].conf, listeners[i].sum
			}
		}
		for i, p := range c.Pools {
			if p.TLS != nil {
				p.TLS.Config, p.TLS.Sum = pools[i].conf, pools[i].sum
			}
		}
	}
}

// LoadAdminToken reads the file that admin_token_file names into AdminToken, so that a
// missing or empty file fails a load (and --check, and a reload) like a bad value does, and
// every reload reads a rotated token. filename is used only in error messages. On error c
// is left as it was.
func (c *Config) LoadAdminToken(filename string) error { return c.load(filename, c.readAdminToken) }

func (c *Config) readAdminToken(d *decoder) (apply func()) {
	if c.AdminTokenFile == "" {
		return func() { c.AdminToken = nil }
	}
	data, err := os.ReadFile(c.AdminTokenFile)
	token := bytes.TrimSpace(data)
	switch {
	case err != nil:
		d.fail(&yaml.Node{Line: c.AdminTokenLine}, "admin_token_file", "%v", err)
	case len(token) == 0:
		d.fail(&yaml.Node{Line: c.AdminTokenLine}, "admin_token_file", "%s is empty: it must hold the token", c.AdminTokenFile)
	}
	return func() {
		c.AdminToken = token
	}
}

// LoadPeerToken reads the file that hot_cache.peer_token_file names into
// HotCache.PeerToken, so that a missing or empty file fails a load (and --check, and a
// reload) like a bad value does, and every reload reads a rotated token. filename is used
// only in error messages. On error c is left as it was.
func (c *Config) LoadPeerToken(filename string) error { return c.load(filename, c.readPeerToken) }

func (c *Config) readPeerToken(d *decoder) (apply func()) {
	h := &c.HotCache
	if h.PeerTokenFile == "" {
		return func() { h.PeerToken = nil }
	}
	data, err := os.ReadFile(h.PeerTokenFile)
	token := bytes.TrimSpace(data)
	switch {
	case err != nil:
		d.fail(&yaml.Node{Line: h.PeerTokenLine}, "hot_cache.peer_token_file", "%v", err)
	case len(token) == 0:
		d.fail(&yaml.Node{Line: h.PeerTokenLine}, "hot_cache.peer_token_file", "%s is empty: it must hold the token", h.PeerTokenFile)
	}
	return func() {
		h.PeerToken = token
	}
}

// LoadSecrets reads the files that auth.users_file and each pool's sasl.password_file name
// into Auth.Users and SASL.Password, so that a missing, empty or malformed file fails a load
// (and --check, and a reload) like a bad value does, and every reload reads them again.
// filename is used only in error messages. On error c is left as it was.
func (c *Config) LoadSecrets(filename string) error { return c.load(filename, c.readSecrets) }

func (c *Config) readSecrets(d *decoder) (apply func()) {
	var users map[string]string
	if a := c.Auth; a != nil && a.UsersFile != "" { // without one, Parse reported it
		data, err := os.ReadFile(a.UsersFile)
		if err != nil {
			d.fail(&yaml.Node{Line: a.Line}, "auth.users_file", "%v", err)
		} else {
			var bad string
			users, bad = ParseUsers(data)
			switch {
			case bad != "":
				d.fail(&yaml.Node{Line: a.Line}, "auth.users_file", "%s: %s", a.UsersFile, bad)
			case len(users) == 0:
				d.fail(&yaml.Node{Line: a.Line}, "auth.users_file", "%s has no users: want lines \"user:password\"", a.UsersFile)
			}
		}
	}
	passwords := make([][]byte, len(c.Pools))
	for i, p := range c.Pools {
		if p.SASL == nil || p.SASL.PasswordFile == "" { // without one, Parse reported it
			continue
		}
		at := "pools." + p.Name + ".sasl.password_file"
		data, err := os.ReadFile(p.SASL.PasswordFile)
		passwords[i] = bytes.TrimSpace(data)
		switch {
		case err != nil:
			d.fail(&yaml.Node{Line: p.SASL.Line}, at, "%v", err)
		case len(passwords[i]) == 0:
			d.fail(&yaml.Node{Line: p.SASL.Line}, at, "%s is empty: it must hold the password", p.SASL.PasswordFile)
		}
	}
	return func() {
		if c.Auth != nil {
			c.Auth.Users = users
		}
		for i, p := range c.Pools {
			if p.SASL != nil {
				p.SASL.Password = passwords[i]
			}
		}
	}
}

// ParseUsers reads a users file: lines "user:password" (memcached's -Y form; the password is
// the rest of the line, a colon included), blank lines and lines starting with # ignored.
// bad describes the first malformed line, "" when none; the password is never in it.
func ParseUsers(data []byte) (users map[string]string, bad string) {
	users = map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, password, ok := strings.Cut(line, ":")
		switch {
		case !ok || user == "" || password == "":
			return nil, fmt.Sprintf("line %d: want \"user:password\"", i+1)
		case strings.ContainsAny(user, " \t"):
			return nil, fmt.Sprintf("line %d: a user name has no spaces", i+1)
		}
		users[user] = password
	}
	return users, ""
}

// fileError reports err, from loading the files of the tls section at line, under the
// field (of fields: each key and its path) that names the file at fault.
func (d *decoder) fileError(line int, section string, err error, fields [][2]string) {
	if err == nil {
		return
	}
	at := section
	var fe *tlsfiles.FileError
	if errors.As(err, &fe) {
		for _, f := range fields {
			if f[1] == fe.Path {
				at = join(section, f[0])
				break
			}
		}
	}
	d.fail(&yaml.Node{Line: line}, at, "%v", err)
}

// Load reads and parses the file at path; errors name the file as path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(data, path)
}

// Warnings are what --check says of a valid config that deserves a second look: an
// apply_at far in the past (the file goes into service at once at every load, and the
// date is likely a typo) or more than a year away (the previous config serves until then).
func (c *Config) Warnings(now time.Time) []string {
	var out []string
	switch at := c.ApplyAt; {
	case at.IsZero():
	case at.Before(now.Add(-24 * time.Hour)):
		out = append(out, fmt.Sprintf("apply_at %s is %s in the past: a load puts this file in service at once; remove apply_at, or check the date",
			at.Format(time.RFC3339), between(at, now)))
	case at.After(now.Add(365 * 24 * time.Hour)):
		out = append(out, fmt.Sprintf("apply_at %s is %s away: until then a reload keeps the previous config in service; check the date",
			at.Format(time.RFC3339), between(now, at)))
	}
	return out
}

// between says how long from a to b, a long time, in days or years (a Duration cannot
// hold 300 years).
func between(a, b time.Time) string {
	if years := b.Year() - a.Year(); years >= 2 {
		return fmt.Sprintf("%d years", years)
	}
	return fmt.Sprintf("%d days", int(b.Sub(a).Hours()/24))
}
