// Package testreq decides what a test does when a real component it needs
// (containerd, runc, root, etcd, etcdctl, JupyterHub, python3-jwt,
// debootstrap, CNI plugins, a browser…) is missing: skip it on a developer's
// machine, fail it where VOYAGER_TEST_REQUIRE says the component must be
// there. CI sets VOYAGER_TEST_REQUIRE=all, so a green run never hides a
// test that did not run. Every such skip in the repository goes through
// Missing.
package testreq
