// Command forge runs the local GitHub stand-in (package forge) on one address: the REST subset,
// git smart HTTP and the admin endpoint, with repositories seeded from directories. It is for
// tests and the offline demo only and must never be deployed or pointed at real users' data.
package main
