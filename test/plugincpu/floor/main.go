// Command floor starts and exits: the CPU floor of a static Go binary
// for test/plugincpu.
package main

func main() {}
