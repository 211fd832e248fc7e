//go:build race

package httpfilter

const raceEnabled = true
