package models

// GCAttachment names one attachment the container runtime still uses
// (CNI GC's cni.dev/valid-attachments).
type GCAttachment struct {
	ContainerID string `json:"container-id"`
	IfName      string `json:"ifname"`
}

// GCRequest is the body of POST /v1/gc.
type GCRequest struct {
	// ValidAttachments lists the attachments to keep; every CNI endpoint
	// (one with a netns and a container interface) not listed is deleted.
	// Required: an empty list deletes every CNI endpoint.
	ValidAttachments []GCAttachment `json:"valid-attachments"`
}

// GCResponse answers POST /v1/gc.
type GCResponse struct {
	// Deleted are the IDs of the endpoints removed.
	Deleted []int64 `json:"deleted"`
}
