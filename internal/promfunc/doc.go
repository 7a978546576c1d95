// Package promfunc makes the Prometheus metrics of Voyager's components
// that read a value when they are scraped: a counter or a gauge named
// voyager_<subsystem>_<name>, with the component's constant labels. Every
// component's Collectors builds its metrics with a Set, so that their
// names, labels and types are made one way.
package promfunc
