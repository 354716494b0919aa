// Package messages holds the value types the actors exchange, one file per
// receiving actor. Every message is sent as a pointer (*T), never as a
// value, so a type switch in Receive cannot silently miss one. Each type's
// comment names its receiver and its reply.
package messages
