module wushexample

go 1.19
