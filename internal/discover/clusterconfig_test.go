package discover

import (
	"reflect"
	"strings"
	"testing"
)

// ElastiCache's documented answer, byte for byte (its length, 147, is not the 136 bytes that
// follow).
const elastiCacheAnswer = "CONFIG cluster 0 147\r\n12\n" +
	"myCluster.pc4ldq.0001.use1.cache.amazonaws.com|10.82.235.120|11211 myCluster.pc4ldq.0002.use1.cache.amazonaws.com|10.80.249.27|11211\n" +
	"\r\nEND\r\n"

func TestParseClusterConfig(t *testing.T) {
	got, err := ParseClusterConfig([]byte(elastiCacheAnswer))
	if err != nil {
		t.Fatal(err)
	}
	want := ClusterConfig{Version: 12, Nodes: []ClusterNode{
		{Host: "myCluster.pc4ldq.0001.use1.cache.amazonaws.com", IP: "10.82.235.120", Port: 11211},
		{Host: "myCluster.pc4ldq.0002.use1.cache.amazonaws.com", IP: "10.80.249.27", Port: 11211},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseClusterConfig = %+v, want %+v", got, want)
	}
	if out := string(AppendClusterConfig(nil, want)); out != strings.Replace(elastiCacheAnswer, " 147\r\n", " 136\r\n", 1) {
		t.Errorf("AppendClusterConfig = %q, want the documented answer with its true length", out)
	}
	for _, bad := range []struct{ name, in, want string }{
		{"not an answer", "ERROR\r\n", "want \"CONFIG cluster 0 \""},
		{"no length", "CONFIG cluster 0 \r\n1\nh|10.0.0.1|1\n\r\nEND\r\n", "bad length"},
		{"no END", "CONFIG cluster 0 14\r\n1\nh|10.0.0.1|1\n\r\n", "want \\r\\nEND"},
		{"bad version", "CONFIG cluster 0 14\r\nx\nh|10.0.0.1|1\n\r\nEND\r\n", "bad version"},
		{"a node without its port", "CONFIG cluster 0 12\r\n1\nh|10.0.0.1\n\r\nEND\r\n", "want host|ip|port"},
		{"a port out of range", "CONFIG cluster 0 18\r\n1\nh|10.0.0.1|65536\n\r\nEND\r\n", "a port from 1 to 65535"},
		{"a node twice", "CONFIG cluster 0 26\r\n1\nh|10.0.0.1|1 h|10.0.0.2|1\n\r\nEND\r\n", "listed twice"},
	} {
		if _, err := ParseClusterConfig([]byte(bad.in)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error with %q", bad.name, err, bad.want)
		}
	}
}

// FuzzParseClusterConfig: any bytes give a config or an error, never a panic, and a config
// read is written back in the form it was read from.
func FuzzParseClusterConfig(f *testing.F) {
	f.Add([]byte(elastiCacheAnswer))
	f.Add([]byte("CONFIG cluster 0 3\r\n1\n\n\r\nEND\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseClusterConfig(data)
		if err != nil {
			return
		}
		again, err := ParseClusterConfig(AppendClusterConfig(nil, c))
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("%q read as %+v, written and read again as %+v, %v", data, c, again, err)
		}
	})
}
