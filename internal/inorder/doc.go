// Package inorder finds an element of a short slice by its id, searching
// from the element found last: the look-up of a batch's call by its id,
// where a commit's events name the calls mostly in the batch's order.
//
// Imports: nothing but the standard library.
package inorder
