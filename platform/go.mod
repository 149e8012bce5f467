module github.com/taskrunner/taskrunner/platform

go 1.26.7

require github.com/taskrunner/taskrunner/proto v0.0.0

replace github.com/taskrunner/taskrunner/proto => ../proto
