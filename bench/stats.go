package main

import (
	"math"
	"sort"
	"strconv"
	"time"
)

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the p-th percentile (0 < p <= 100, nearest rank) of
// the samples, in milliseconds; NaN when there are none.
func percentile(samples []time.Duration, p float64) float64 {
	if len(samples) == 0 {
		return math.NaN()
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(s) {
		rank = len(s)
	}
	return ms(s[rank-1])
}

// median returns the median of values (the lower middle one for an even
// count, so that it is always a measured value); NaN when there are none.
func median(values []float64) float64 {
	var v []float64
	for _, x := range values {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	sort.Float64s(v)
	return v[(len(v)-1)/2]
}

// ratio returns a/b, or NaN when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// Num is a float64 that encodes NaN as JSON null.
type Num float64

// MarshalJSON writes null for NaN and infinities.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	// Three decimals are plenty for every figure here.
	r := math.Round(f*1000) / 1000
	return strconv.AppendFloat(nil, r, 'f', -1, 64), nil
}

// nan is a figure that was not measured.
func nan() float64 { return math.NaN() }
