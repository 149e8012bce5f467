module github.com/taskrunner/taskrunner/gateway

go 1.26.7
