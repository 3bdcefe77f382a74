package githubtest

import (
	"net/http"
	"slices"
)

// The handlers below run with s.mu held; body is the decoded JSON body.

func (s *Server) createIssue(rs *repoState, repo string, _ int, body any) (int, any) {
	m, _ := body.(map[string]any)
	title, _ := m["title"].(string)
	if title == "" {
		return http.StatusUnprocessableEntity, message("Validation Failed")
	}
	text, _ := m["body"].(string)
	i := &Issue{Number: rs.next, Title: title, Body: text, Labels: stringList(m["labels"]), State: "open"}
	rs.next++
	rs.issues[i.Number] = i
	return http.StatusCreated, s.issueJSON(repo, i)
}

func (s *Server) comment(rs *repoState, repo string, num int, body any) (int, any) {
	i, ok := rs.issues[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	m, _ := body.(map[string]any)
	text, _ := m["body"].(string)
	if text == "" {
		return http.StatusUnprocessableEntity, message("Validation Failed")
	}
	i.Comments = append(i.Comments, text)
	s.nextID++
	return http.StatusCreated, map[string]any{
		"id": s.nextID, "body": text,
		"html_url": s.htmlURL(repo, kindOf(i), num) + "#issuecomment-" + itoa(s.nextID),
	}
}

func (s *Server) addLabels(rs *repoState, _ string, num int, body any) (int, any) {
	i, ok := rs.issues[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	// GitHub takes a bare array or {"labels": [...]}.
	labels := stringList(body)
	if m, ok := body.(map[string]any); ok {
		labels = stringList(m["labels"])
	}
	if len(labels) == 0 {
		return http.StatusUnprocessableEntity, message("Validation Failed")
	}
	for _, l := range labels {
		if !slices.Contains(i.Labels, l) {
			i.Labels = append(i.Labels, l)
		}
	}
	out := []any{}
	for _, l := range i.Labels {
		out = append(out, map[string]any{"name": l})
	}
	return http.StatusOK, out
}

func (s *Server) editIssue(rs *repoState, repo string, num int, body any) (int, any) {
	i, ok := rs.issues[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	m, _ := body.(map[string]any)
	if state, ok := m["state"].(string); ok {
		if state != "open" && state != "closed" {
			return http.StatusUnprocessableEntity, message("Validation Failed")
		}
		i.State = state
		if p, ok := rs.pulls[num]; ok {
			p.State = state
		}
	}
	return http.StatusOK, s.issueJSON(repo, i)
}

func (s *Server) getIssue(rs *repoState, repo string, num int, _ any) (int, any) {
	i, ok := rs.issues[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	return http.StatusOK, s.issueJSON(repo, i)
}

func (s *Server) getPR(rs *repoState, repo string, num int, _ any) (int, any) {
	p, ok := rs.pulls[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	return http.StatusOK, s.prJSON(repo, p)
}

func (s *Server) createPR(rs *repoState, repo string, _ int, body any) (int, any) {
	m, _ := body.(map[string]any)
	title, _ := m["title"].(string)
	head, _ := m["head"].(string)
	base, _ := m["base"].(string)
	if title == "" || head == "" || base == "" {
		return http.StatusUnprocessableEntity, message("Validation Failed")
	}
	for _, p := range rs.pulls {
		if p.State == "open" && p.Head == head && p.Base == base {
			return http.StatusUnprocessableEntity, map[string]any{"message": "Validation Failed",
				"errors": []any{map[string]any{"resource": "PullRequest", "code": "custom",
					"message": "A pull request already exists for " + head + "."}}}
		}
	}
	text, _ := m["body"].(string)
	draft, _ := m["draft"].(bool)
	n := s.addPR(rs, repo, PR{Title: title, Body: text, Head: head, HeadRepo: repo, Base: base, Draft: draft})
	return http.StatusCreated, s.prJSON(repo, rs.pulls[n])
}

func (s *Server) createReview(rs *repoState, repo string, num int, body any) (int, any) {
	p, ok := rs.pulls[num]
	if !ok {
		return http.StatusNotFound, message("Not Found")
	}
	m, _ := body.(map[string]any)
	event, _ := m["event"].(string)
	text, _ := m["body"].(string)
	switch {
	case event != "COMMENT" && event != "APPROVE" && event != "REQUEST_CHANGES",
		event != "APPROVE" && text == "":
		return http.StatusUnprocessableEntity, message("Validation Failed")
	}
	p.Reviews = append(p.Reviews, Review{Event: event, Body: text})
	s.nextID++
	return http.StatusOK, map[string]any{
		"id": s.nextID, "body": text, "state": reviewState(event),
		"html_url": s.htmlURL(repo, "pull", num) + "#pullrequestreview-" + itoa(s.nextID),
	}
}

// addPR stores p (with its issue side) and returns its number.
func (s *Server) addPR(rs *repoState, repo string, p PR) int {
	if p.Number == 0 {
		p.Number = rs.next
	}
	if p.Number >= rs.next {
		rs.next = p.Number + 1
	}
	if p.State == "" {
		p.State = "open"
	}
	if p.HeadRepo == "" {
		p.HeadRepo = repo
	}
	rs.pulls[p.Number] = &p
	rs.issues[p.Number] = &Issue{Number: p.Number, Title: p.Title, Body: p.Body, State: p.State, IsPR: true}
	return p.Number
}

func (s *Server) issueJSON(repo string, i *Issue) map[string]any {
	labels := []any{}
	for _, l := range i.Labels {
		labels = append(labels, map[string]any{"name": l})
	}
	out := map[string]any{
		"number": i.Number, "title": i.Title, "body": i.Body, "state": i.State, "labels": labels,
		"html_url": s.htmlURL(repo, kindOf(i), i.Number),
	}
	if i.IsPR {
		// GitHub marks a pull request's issue side with its links.
		out["pull_request"] = map[string]any{"html_url": s.htmlURL(repo, "pull", i.Number)}
	}
	return out
}

func (s *Server) prJSON(repo string, p *PR) map[string]any {
	def := p.HeadDefault
	if def == "" {
		def = "main"
	}
	return map[string]any{
		"number": p.Number, "title": p.Title, "body": p.Body, "state": p.State, "draft": p.Draft,
		"html_url": s.htmlURL(repo, "pull", p.Number),
		"head":     map[string]any{"ref": p.Head, "repo": map[string]any{"full_name": p.HeadRepo, "default_branch": def}},
		"base":     map[string]any{"ref": p.Base, "repo": map[string]any{"full_name": repo}},
	}
}

func kindOf(i *Issue) string {
	if i.IsPR {
		return "pull"
	}
	return "issues"
}

func reviewState(event string) string {
	switch event {
	case "APPROVE":
		return "APPROVED"
	case "REQUEST_CHANGES":
		return "CHANGES_REQUESTED"
	}
	return "COMMENTED"
}

// strings_ is v as a list of strings (nil when it is not one).
func stringList(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
