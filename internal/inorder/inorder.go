package inorder

// Find returns the element of s whose id is id (nil: none), searching from
// index *last and around; it sets *last to the element's index.
func Find[T any](s []T, last *int, id string, idOf func(*T) string) *T {
	for i := range s {
		j := (*last + i) % len(s)
		if idOf(&s[j]) == id {
			*last = j
			return &s[j]
		}
	}
	return nil
}
