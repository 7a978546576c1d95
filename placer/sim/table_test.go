package sim

import "testing"

// TestSharesCell: both tables' shares cell names every user, in name
// order, with its share in whole percent; none is an empty cell.
func TestSharesCell(t *testing.T) {
	for _, tc := range []struct {
		share map[string]float64
		want  string
	}{
		{map[string]float64{"flood": 0.5, "ada": 0.25, "bob": 0.254}, "ada 25%, bob 25%, flood 50%"},
		{nil, ""},
	} {
		if got := sharesCell(tc.share); got != tc.want {
			t.Errorf("sharesCell(%v) = %q, want %q", tc.share, got, tc.want)
		}
	}
}
