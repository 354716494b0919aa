//go:build linux

package e2e
