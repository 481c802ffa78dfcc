// Package located formats and orders the problems of a configuration file
// (the catalog, a worker config): each names its file, its line, the part
// of the document it is about, and what is wrong.
//
// Imports: go.yaml.in/yaml/v3.
package located
