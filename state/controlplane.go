package state

import "time"

// dirControlPlane holds the endpoints control-plane processes serve.
const dirControlPlane = "controlplane"

// ControlPlaneDir is the prefix of the control plane's endpoint records
// (controlplane/<kind>/<name>), which every agent reads to keep sessions
// off them.
func (k Keys) ControlPlaneDir() string { return k.dir(dirControlPlane) }

// ControlPlaneKind is the prefix of the records of one kind of process
// (api, placer, agent).
func (k Keys) ControlPlaneKind(kind string) string { return k.key(dirControlPlane, kind) + "/" }

// ControlPlane is the key of the record of process name of kind.
func (k Keys) ControlPlane(kind, name string) string { return k.key2(dirControlPlane, kind, name) }

// Kinds of control-plane endpoint records.
const (
	EndpointAPI    = "api"
	EndpointPlacer = "placer"
	EndpointAgent  = "agent"
)

// Endpoints is what one control-plane process serves, stored at
// controlplane/<kind>/<name> under the process's lease: the addresses
// (IPv4 host:port) other machines reach it at. Agents deny their sessions
// every one of them (docs/networking.md).
type Endpoints struct {
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	Addresses []string  `json:"addresses"`
	Updated   time.Time `json:"updated"`
}
