package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// gcParallel bounds concurrent deletions of one GC call.
const gcParallel = 8

// gc deletes every CNI endpoint (one with a netns and a container
// interface name, as membrane-cni creates them) whose (container ID,
// interface) is not listed, releasing its addresses and identity and
// tearing its host veth down. Endpoints created otherwise are kept.
func (s *Server) gc(w http.ResponseWriter, r *http.Request) error {
	var req models.GCRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.ValidAttachments == nil {
		return badRequest("field \"valid-attachments\": required (an empty list deletes every CNI endpoint)")
	}
	valid := make(map[models.GCAttachment]bool, len(req.ValidAttachments))
	for i, a := range req.ValidAttachments {
		if a.ContainerID == "" || a.IfName == "" {
			return badRequest(fmt.Sprintf("field \"valid-attachments[%d]\": container-id and ifname are required", i))
		}
		valid[a] = true
	}
	var stale []endpoint.ID
	for _, ep := range s.ix.Endpoints(index.EndpointFilter{}) {
		if ep.Netns == "" || ep.ContainerID == "" || ep.ContainerInterfaceName == "" {
			continue
		}
		if !valid[models.GCAttachment{ContainerID: ep.ContainerID, IfName: ep.ContainerInterfaceName}] {
			stale = append(stale, ep.ID)
		}
	}
	deleted, err := s.deleteEndpoints(r.Context(), stale)
	if err != nil {
		return err
	}
	s.log.Info("cni gc", "valid", len(valid), "deleted", len(deleted))
	writeJSON(w, http.StatusOK, &models.GCResponse{Deleted: deleted})
	return nil
}

// deleteEndpoints deletes ids, gcParallel at a time. An endpoint already
// gone or being deleted counts as deleted; the first other error is
// returned after every deletion finished.
func (s *Server) deleteEndpoints(ctx context.Context, ids []endpoint.ID) ([]int64, error) {
	var (
		mu       sync.Mutex // guards deleted and firstErr
		deleted  = []int64{}
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, gcParallel)
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			_, err := s.sys.DeleteEndpoint(ctx, id, endpoint.DeleteOptions{})
			if errors.Is(err, actors.ErrEndpointNotFound) || errors.Is(err, actors.ErrEndpointDeleting) {
				err = nil
			}
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				deleted = append(deleted, int64(id))
			} else if firstErr == nil {
				firstErr = fmt.Errorf("gc endpoint %d: %w", id, err)
			}
		}()
	}
	wg.Wait()
	sort.Slice(deleted, func(i, j int) bool { return deleted[i] < deleted[j] })
	return deleted, firstErr
}
