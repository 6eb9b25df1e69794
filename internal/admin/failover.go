package admin

import (
	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/prometheus/client_golang/prometheus"
)

// StandInCollectors export what the process remembers of writes to stand-ins (see
// failover.StandIns): the keys remembered now, against the bound, and the writes not
// remembered because it was reached.
func StandInCollectors(s *failover.StandIns, max int) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "moxi_failover_keys_remembered",
			Help: "Keys written to a stand-in while their server was dead, to be deleted before it serves again.",
		}, func() float64 { return float64(s.Remembered()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "moxi_failover_keys_remembered_max",
			Help: "The most keys moxi remembers having written to stand-ins.",
		}, func() float64 { return float64(max) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "moxi_failover_keys_forgotten_total",
			Help: "Writes to a stand-in not remembered because the memory for them was full; failover_ttl bounds their older copies.",
		}, func() float64 { return float64(s.Forgotten()) }),
	}
}
