module wushupgradecheck

go 1.19
