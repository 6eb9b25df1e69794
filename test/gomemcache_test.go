package test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// exerciseGomemcache runs gomemcache's whole API against addr and checks every answer.
func exerciseGomemcache(t *testing.T, addr string) {
	t.Helper()
	c := memcache.New(addr)
	c.MaxIdleConns = 4
	defer c.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	want := func(err, target error) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("got %v, want %v", err, target)
		}
	}

	must(c.Ping())
	must(c.FlushAll())

	must(c.Set(&memcache.Item{Key: "gm:a", Value: []byte("alpha"), Flags: 42}))
	it, err := c.Get("gm:a")
	must(err)
	if string(it.Value) != "alpha" || it.Flags != 42 {
		t.Fatalf("get gm:a = %q flags %d", it.Value, it.Flags)
	}
	_, err = c.Get("gm:missing")
	want(err, memcache.ErrCacheMiss)

	want(c.Add(&memcache.Item{Key: "gm:a", Value: []byte("x")}), memcache.ErrNotStored)
	must(c.Add(&memcache.Item{Key: "gm:b", Value: []byte("beta")}))
	must(c.Replace(&memcache.Item{Key: "gm:b", Value: []byte("beta2")}))
	want(c.Replace(&memcache.Item{Key: "gm:nope", Value: []byte("x")}), memcache.ErrNotStored)
	must(c.Append(&memcache.Item{Key: "gm:b", Value: []byte("+")}))
	must(c.Prepend(&memcache.Item{Key: "gm:b", Value: []byte("-")}))
	it, err = c.Get("gm:b")
	must(err)
	if string(it.Value) != "-beta2+" {
		t.Fatalf("after append/prepend: %q", it.Value)
	}

	// Compare and swap: the second swap with the stale cas must fail.
	it, err = c.Get("gm:a")
	must(err)
	stale := *it
	it.Value = []byte("alpha2")
	must(c.CompareAndSwap(it))
	stale.Value = []byte("lost")
	want(c.CompareAndSwap(&stale), memcache.ErrCASConflict)

	// Multi-get over many keys (spread over every shard or server), in one request.
	var keys []string
	for i := range 200 {
		k := fmt.Sprintf("gm:multi:%d", i)
		keys = append(keys, k)
		if i%3 != 0 {
			must(c.Set(&memcache.Item{Key: k, Value: []byte(k + "=v"), Flags: uint32(i)}))
		}
	}
	got, err := c.GetMulti(keys)
	must(err)
	for i, k := range keys {
		it, ok := got[k]
		if i%3 == 0 {
			if ok {
				t.Fatalf("GetMulti: %s should be a miss", k)
			}
			continue
		}
		if !ok || string(it.Value) != k+"=v" || it.Flags != uint32(i) {
			t.Fatalf("GetMulti: %s = %+v", k, it)
		}
	}

	must(c.Set(&memcache.Item{Key: "gm:n", Value: []byte("10")}))
	n, err := c.Increment("gm:n", 5)
	must(err)
	if n != 15 {
		t.Fatalf("incr = %d", n)
	}
	n, err = c.Decrement("gm:n", 20)
	must(err)
	if n != 0 {
		t.Fatalf("decr below zero = %d, want 0", n)
	}
	_, err = c.Increment("gm:nope", 1)
	want(err, memcache.ErrCacheMiss)

	must(c.Touch("gm:a", 100))
	want(c.Touch("gm:nope", 100), memcache.ErrCacheMiss)
	it, err = c.GetAndTouch("gm:a", 100)
	must(err)
	if string(it.Value) != "alpha2" {
		t.Fatalf("gat = %q", it.Value)
	}

	must(c.Delete("gm:a"))
	want(c.Delete("gm:a"), memcache.ErrCacheMiss)

	big := bytes.Repeat([]byte("z"), 500_000)
	must(c.Set(&memcache.Item{Key: "gm:big", Value: big}))
	it, err = c.Get("gm:big")
	must(err)
	if !bytes.Equal(it.Value, big) {
		t.Fatal("500 KB value changed on the way")
	}

	must(c.DeleteAll())
	_, err = c.Get("gm:b")
	want(err, memcache.ErrCacheMiss)
}

func TestGomemcacheEmbeddedDefault(t *testing.T) {
	moxi := startMoxi(t)
	exerciseGomemcache(t, moxi.addr)
}
