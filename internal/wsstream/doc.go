// Package wsstream is the framing of the byte streams Voyager carries over
// WebSocket between the CLI, the API and a node agent: a command executed
// in a session (voyager session exec) and a TCP connection forwarded to a
// port inside a session (voyager session port-forward, voyager ssh).
//
// Every WebSocket message is binary: its first byte names a channel, the
// rest is that channel's payload, as in Kubernetes' channel.k8s.io
// protocol. The client writes Stdin, Resize and CloseStdin; the server
// writes Stdout, Stderr and, last, Exit, then closes. A forwarded
// connection uses Stdin and Stdout for its two directions and CloseStdin
// for the client's half-close. The API relays messages between the
// client's WebSocket and the agent's unchanged (Relay), reading the Exit
// message on its way for its audit log.
package wsstream
