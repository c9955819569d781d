package server

import (
	"fmt"
	"net/http"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/webhook"
)

// maxWebhookBody bounds POST /webhooks: a URL, a few types, a secret.
const maxWebhookBody = 64 << 10

// webhooks is the server's webhook service; ErrUnavailable when it has
// none.
func (s *Server) webhooks() (*webhook.Service, error) {
	if s.opt.Webhooks == nil {
		return nil, fmt.Errorf("this server has no webhooks: %w", errdefs.ErrUnavailable)
	}
	return s.opt.Webhooks, nil
}

// createWebhook: POST /webhooks. 201 with the webhook and, this
// once, its secret.
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request) {
	var req api.WebhookRequest
	if err := decodeJSON(r, &req, maxWebhookBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	wh, err := s.webhooks()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := wh.Create(r.Context(), tenant(r), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

// listWebhooks: GET /webhooks.
func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request) {
	wh, err := s.webhooks()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := wh.List(r.Context(), tenant(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.WebhookList{Webhooks: list})
}

// getWebhook: GET /webhooks/{id}; another tenant's is 404.
func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request) {
	wh, err := s.webhooks()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := wh.Get(r.Context(), tenant(r), r.PathValue("webhook_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteWebhook: DELETE /webhooks/{id}; 204, or 404 for one the tenant
// does not have.
func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request) {
	wh, err := s.webhooks()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := wh.Delete(r.Context(), tenant(r), r.PathValue("webhook_id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// webhookDeliveries: GET /webhooks/{id}/deliveries: the delivery log.
func (s *Server) webhookDeliveries(w http.ResponseWriter, r *http.Request) {
	wh, err := s.webhooks()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out, err := wh.Deliveries(r.Context(), tenant(r), r.PathValue("webhook_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
