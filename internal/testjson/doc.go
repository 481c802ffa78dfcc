// Package testjson compares JSON texts in tests: equal when they are texts
// of one value, whatever the key order and spacing.
//
// Imports: nothing but the standard library.
package testjson
