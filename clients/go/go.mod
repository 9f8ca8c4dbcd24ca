module sluice

go 1.19
