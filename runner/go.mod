module github.com/taskrunner/taskrunner/runner

go 1.26.7

require (
	github.com/caarlos0/env/v11 v11.4.2
	github.com/google/go-github/v62 v62.0.0
	github.com/stretchr/testify v1.12.1
	github.com/taskrunner/taskrunner/proto v0.0.0
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

require (
	github.com/google/go-querystring v1.1.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.33.0 // indirect
	github.com/taskrunner/taskrunner/tools v0.0.0
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261026165753-2ffab32bce7e // indirect
)

replace github.com/taskrunner/taskrunner/proto => ../proto

replace github.com/taskrunner/taskrunner/tools => ../tools

replace github.com/taskrunner/taskrunner/services => ../services
