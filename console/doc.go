// Package console is Voyager's web console: the cluster, the queue, the
// caller's sessions, their history and the admin settings as pages, served
// by `voyager api` (and so `voyager dev`) under /console/ on the API's own
// gin engine.
//
// Pages are server-rendered with html/template. A page's shell carries no
// data; a small script (assets/app.js, no build step, no CDN) fetches the
// page's view from /console/view/… with the bearer token the user pasted
// once, kept in the tab's sessionStorage. The console renders a view by
// calling the JSON API in-process through the API's own handler with that
// same Authorization header, so it authenticates, authorises, rate-limits
// and filters exactly as the API does: it shows nothing the API would not.
// Live phases and following logs come straight from the API's event and
// log streams. Everything the pages need is embedded in the binary.
package console
