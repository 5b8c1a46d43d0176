module github.com/libwush/libwush/bindings/go/wush

go 1.19
