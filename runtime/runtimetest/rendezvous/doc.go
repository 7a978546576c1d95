// Command rendezvous is the test image's stand-in for torchrun's
// rendezvous (not torchrun): every part of a multi-node job runs it.
// Rank 0 listens on MASTER_PORT; every other rank connects to
// MASTER_ADDR:MASTER_PORT (retrying until -timeout) and says its rank, the
// world size it was given and its peer endpoint. Rank 0 checks that every
// rank 1 to WORLD_SIZE-1 arrived exactly once with the same world size,
// then sends every rank the list of peer endpoints; each rank then
// connects to every other rank's endpoint (the first of its
// VOYAGER_PEER_PORTS on VOYAGER_NODE_ADDR), as NCCL's and Gloo's ranks
// connect to each other, and waits for every other rank's connection. It
// also checks that the hostfile names its own address on its rank's line.
// It exits 0 when all of that held, 1 otherwise, saying why.
//
// With -mesh ephemeral each rank listens on a port the kernel chooses and
// advertises the address of its interface NCCL_SOCKET_IFNAME (eth0 when
// unset), as NCCL's and Gloo's ranks do: the mesh then needs the parts to
// reach each other at their containers' own addresses. With -serve a rank
// keeps answering on its mesh endpoint (HTTP 200) after the check, until
// it is killed, so that a test can try to reach it from elsewhere.
package main
