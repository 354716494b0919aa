// Package events is the agent's event hub: actors and the API publish
// operator-facing events (endpoint created, state changed, deleted;
// identity allocated and released; policy revisions; datapath drops) and
// GET /v1/events streams them as Server-Sent Events.
//
// Publishing never blocks: events go into a fixed-size ring buffer with
// sequence numbers and subscribers read from it at their own pace. A
// subscriber that falls more than the ring's capacity behind is told how
// many events it missed (a Missed marker) instead of being silently
// dropped or slowing the publisher down.
package events
