package sim

import "testing"

func TestChurnRates(t *testing.T) {
	ramp, churn, settle := phaseNames[phaseRamp], phaseNames[phaseChurn], phaseNames[phaseSettle]
	seq := func(phases []string, rates []float64) []Sample {
		tl := make([]Sample, len(rates))
		for i := range rates {
			tl[i] = Sample{Phase: phases[i], LifecyclesPerS: rates[i], OpsPerS: 4 * rates[i]}
		}
		return tl
	}
	tests := []struct {
		name    string
		tl      []Sample
		min     float64
		meanOps float64
	}{
		{
			// The first churn sample's second was mostly ramp-up.
			name: "partial first churn second left out",
			tl: seq([]string{ramp, ramp, churn, churn, churn, churn, churn, churn, churn, settle},
				[]float64{0, 0, 100, 2000, 2100, 2000, 2100, 2000, 1900, 500}),
			min: 2020, meanOps: 4 * 2016.6666666666667,
		},
		{
			name: "slowest window",
			tl: seq([]string{ramp, churn, churn, churn, churn, churn, churn, churn},
				[]float64{0, 100, 3000, 3000, 1000, 1000, 1000, 1000}),
			min: 1400, meanOps: 4 * 1666.6666666666667,
		},
		{
			name: "only a partial churn sample",
			tl:   seq([]string{ramp, churn, settle}, []float64{0, 100, 0}),
			min:  100, meanOps: 400,
		},
		{name: "no churn", tl: seq([]string{ramp}, []float64{10}), min: 0, meanOps: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			minLC, ops := churnRates(tt.tl)
			if diff := minLC - tt.min; diff > 1e-6 || diff < -1e-6 {
				t.Errorf("slowest 5 s = %v, want %v", minLC, tt.min)
			}
			if diff := ops - tt.meanOps; diff > 1e-6 || diff < -1e-6 {
				t.Errorf("mean ops = %v, want %v", ops, tt.meanOps)
			}
		})
	}
}
