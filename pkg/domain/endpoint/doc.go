// Package endpoint defines what an endpoint is, independent of who runs it:
// the immutable Endpoint record that the endpoint actor publishes and the
// index stores, the lifecycle State with Cilium's allowed transitions, and
// the conversion to the API model. It has no behaviour that blocks.
package endpoint
