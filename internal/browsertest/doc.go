// Package browsertest starts Debian's Chromium headless for the browser
// tests of the web console, JupyterHub and JupyterLab, so that the browser
// leaves nothing behind on the host: its profile and its temporary
// directory (where Chromium makes its singleton socket, otherwise
// /tmp/org.chromium.Chromium.*, which it never removes) are the test's
// own and are removed when the test ends.
package browsertest
