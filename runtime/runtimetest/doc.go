// Package runtimetest tests runtime implementations: Run is the contract
// suite every runtime.Runtime passes, Containerd gives a test a real
// containerd (a private daemon this package starts, as root), and
// BusyboxImage imports a test image built without any registry.
package runtimetest
