module github.com/taskrunner/taskrunner/runner

go 1.26.7
