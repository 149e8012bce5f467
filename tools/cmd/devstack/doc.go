// Command devstack is the local stack launcher behind `make run` and
// `make test`: `devstack deps` makes sure PostgreSQL and Redis answer
// (starting throwaway servers under .dev/ when they do not) and prints their
// URLs as shell exports; `devstack up` runs the whole stack until Ctrl-C.
package main
