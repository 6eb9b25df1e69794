package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/migrate"
)

// MigrationCollector exports the progress of the migrations being copied.
type MigrationCollector struct {
	B             Migrations
	copied, total *prometheus.Desc
}

// NewMigrationCollector returns the collector of b's migrations.
func NewMigrationCollector(b Migrations) *MigrationCollector {
	labels := []string{"pool", "server"}
	return &MigrationCollector{
		B:      b,
		copied: prometheus.NewDesc("moxi_migration_keys_copied", "Keys copied to the new server of a slot being migrated (only while copying).", labels, nil),
		total:  prometheus.NewDesc("moxi_migration_keys_total", "Keys listed on the old server of a slot being migrated (only while copying).", labels, nil),
	}
}

func (c *MigrationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.copied
	ch <- c.total
}

func (c *MigrationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.B.Migrations() {
		if st.Phase != migrate.Copying {
			continue // gone once done, so that "no progress" alerts see only live copies
		}
		ch <- prometheus.MustNewConstMetric(c.copied, prometheus.GaugeValue, float64(st.KeysCopied), st.Pool, st.Name)
		ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(st.KeysTotal), st.Pool, st.Name)
	}
}

// migration is one entry of GET /migrations.
type migration struct {
	Pool       string `json:"pool"`
	Name       string `json:"name"`
	From       string `json:"from"`
	To         string `json:"to"`
	Phase      string `json:"phase"`
	KeysCopied int64  `json:"keys_copied"`
	KeysTotal  int64  `json:"keys_total"`
	Started    string `json:"started"`
	Finished   string `json:"finished"`
	Error      string `json:"error"`
}

func migrationsJSON(sts []migrate.Status) []migration {
	out := make([]migration, 0, len(sts))
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, st := range sts {
		out = append(out, migration{st.Pool, st.Name, st.From, st.To, st.Phase, st.KeysCopied, st.KeysTotal, stamp(st.Started), stamp(st.Finished), st.Err})
	}
	return out
}
