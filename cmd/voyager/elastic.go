package main

import (
	"fmt"
	"strconv"
	"strings"
)

// gpuRange is the --gpus flag: a count N, or MIN-MAX for an elastic job
// (the API's elastic range; the API checks the numbers).
type gpuRange struct{ n, max *int }

func (g *gpuRange) String() string {
	if g.n == nil {
		return "0"
	}
	if g.max != nil && *g.max > 0 {
		return fmt.Sprintf("%d-%d", *g.n, *g.max)
	}
	return strconv.Itoa(*g.n)
}

func (g *gpuRange) Set(v string) error {
	lo, hi, ranged := strings.Cut(v, "-")
	n, err := strconv.Atoi(lo)
	if err != nil || n < 0 {
		return fmt.Errorf("want a number of GPUs such as 2, or a range MIN-MAX such as 2-8 for an elastic job")
	}
	*g.n, *g.max = n, 0
	if !ranged {
		return nil
	}
	m, err := strconv.Atoi(hi)
	if err != nil || m < 1 {
		return fmt.Errorf("want a range MIN-MAX such as 2-8 for an elastic job, got %q", v)
	}
	*g.max = m
	return nil
}

func (g *gpuRange) Type() string { return "N|MIN-MAX" }

// nodeCount is the --nodes flag: a count N, or MIN-MAX for an elastic
// multi-node job (the API's elastic minNodes and maxNodes; the API checks
// the numbers).
type nodeCount struct{ n, max *int }

func (c nodeCount) String() string {
	if c.n == nil {
		return "0"
	}
	if c.max != nil && *c.max > 0 {
		return fmt.Sprintf("%d-%d", *c.n, *c.max)
	}
	return strconv.Itoa(*c.n)
}

func (c nodeCount) Set(v string) error {
	lo, hi, ranged := strings.Cut(v, "-")
	n, err := strconv.Atoi(lo)
	if err != nil || n < 0 {
		return fmt.Errorf("want a number of machines such as 2, or a range MIN-MAX such as 1-4 for an elastic multi-node job")
	}
	*c.n, *c.max = n, 0
	if !ranged {
		return nil
	}
	m, err := strconv.Atoi(hi)
	if err != nil || m < 1 {
		return fmt.Errorf("want a range MIN-MAX such as 1-4 for an elastic multi-node job, got %q", v)
	}
	*c.max = m
	return nil
}

func (c nodeCount) Type() string { return "N|MIN-MAX" }
