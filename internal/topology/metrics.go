package topology

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/migrate"
)

// MigrationCollector exports the progress of the migrations being copied.
type MigrationCollector struct {
	B             *Builder
	copied, total *prometheus.Desc
}

// NewMigrationCollector returns the collector of b's migrations.
func NewMigrationCollector(b *Builder) *MigrationCollector {
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
