package proxy

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// SetCachedNode puts a Node with labels into p's node cache, as a cache that
// has not yet heard of the Node's latest change holds it.
func SetCachedNode(p *Proxy, name string, labels map[string]string) error {
	return p.cache.informer.GetStore().Update(&metav1.PartialObjectMetadata{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "cached", ResourceVersion: "1", Labels: labels},
	})
}

// DropCachedNode removes a Node from p's node cache, as a cache that has not
// yet heard of the Node holds nothing for it.
func DropCachedNode(p *Proxy, name string) error {
	return p.cache.informer.GetStore().Delete(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// AnswersIdle says whether p holds no answer of the API server against its
// budget of answers.
func AnswersIdle(p *Proxy) bool {
	if !p.answers.TryAcquire(answerBudget) {
		return false
	}
	p.answers.Release(answerBudget)
	return true
}
