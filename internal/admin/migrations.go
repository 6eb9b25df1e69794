package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/migrate"
)

// migrationPhases are the phases moxi_migration_phase has a series for, one per migration
// each: 1 for the migration's current phase, 0 for the others.
var migrationPhases = []string{migrate.Scheduled, migrate.Copying, migrate.Done, migrate.Failed}

// MigrationCollector exports the progress of the migrations that GET /migrations lists,
// for as long as it lists them (done and failed included), so that a migration that ends
// between two scrapes is still seen.
type MigrationCollector struct {
	B                              Migrations
	copied, listed, phase, rebuilt *prometheus.Desc
}

// NewMigrationCollector returns the collector of b's migrations.
func NewMigrationCollector(b Migrations) *MigrationCollector {
	labels := []string{"pool", "server"}
	return &MigrationCollector{
		B:       b,
		copied:  prometheus.NewDesc("moxi_migration_keys_copied", "Keys copied to the new server of a migrating slot, by the background copy or by reads.", labels, nil),
		listed:  prometheus.NewDesc("moxi_migration_keys_listed", "Keys listed on the old server of a migrating slot so far: the copy lists and copies in batches, so this leads keys_copied by at most a batch (of 250) and is the old server's item count once the phase is done.", labels, nil),
		phase:   prometheus.NewDesc("moxi_migration_phase", "1 for the phase a migrating slot is in (scheduled, copying, done, failed), 0 for the others.", append(labels, "phase"), nil),
		rebuilt: prometheus.NewDesc("moxi_rebuild_keys_copied", "Keys copied to a server that came back empty (restarted, or flushed) from its pool's other replicas, by its rebuild (GET /migrations: rebuild-<n>).", labels, nil),
	}
}

func (c *MigrationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.copied
	ch <- c.listed
	ch <- c.phase
	ch <- c.rebuilt
}

func (c *MigrationCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.B.Migrations() {
		if st.Server != "" { // a rebuild's
			ch <- prometheus.MustNewConstMetric(c.rebuilt, prometheus.GaugeValue, float64(st.KeysCopied), st.Pool, st.Server)
		}
		ch <- prometheus.MustNewConstMetric(c.copied, prometheus.GaugeValue, float64(st.KeysCopied), st.Pool, st.Name)
		ch <- prometheus.MustNewConstMetric(c.listed, prometheus.GaugeValue, float64(st.KeysTotal), st.Pool, st.Name)
		for _, ph := range migrationPhases {
			v := 0.0
			if ph == st.Phase {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.phase, prometheus.GaugeValue, v, st.Pool, st.Name, ph)
		}
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
	KeysTotal  int64  `json:"keys_total"` // keys listed on the old server so far; all of them once done
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
