package batch

// BenchBatch is benchBatch for the external test package (fuzz_test.go), which imports wire:
// wire imports this package, so a test of this package that imports wire must be external.
var BenchBatch = benchBatch
