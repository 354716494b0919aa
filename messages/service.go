package messages

import "github.com/membrane-cni/membrane/pkg/domain/service"

// ServiceUpsert asks the services actor to add or replace Source's
// services (validated by the sender); with Replace, Source's frontends
// not in Services go. Reply: *ServiceResult once the datapath write
// holding the change finished.
type ServiceUpsert struct {
	Source   string
	Services []service.Service
	Replace  bool
}

// ServiceDelete asks the services actor to delete Source's Frontends (a
// frontend it does not hold is skipped). Reply: *ServiceResult.
type ServiceDelete struct {
	Source    string
	Frontends []service.Frontend
}

// ServicePrune tells the services actor to make the datapath's service
// maps hold exactly its table, deleting what a previous agent left. Sent
// once the feeders delivered their first full sets. No reply.
type ServicePrune struct{}

// ServiceResult answers ServiceUpsert and ServiceDelete: Err is the
// request's refusal (service.ErrConflict) or the first datapath error of
// its frontends (the actor retries those); Upserted and Deleted count
// the frontends the request changed.
type ServiceResult struct {
	Err      error
	Upserted int
	Deleted  int
}
