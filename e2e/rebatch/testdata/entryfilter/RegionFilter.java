package rebatchproxy.e2e;

import java.util.Map;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.pulsar.broker.service.Subscription;
import org.apache.pulsar.broker.service.plugin.EntryFilter;
import org.apache.pulsar.broker.service.plugin.FilterContext;
import org.apache.pulsar.common.api.proto.KeyValue;
import org.apache.pulsar.common.api.proto.MessageMetadata;

/**
 * A broker entry filter (PIP-105) for the PIP-191 end-to-end test: it rejects a whole entry,
 * for one subscription, when the entry's outer metadata has the property "region" equal to
 * the subscription's property "reject-region". It never looks inside a batch: the outer
 * properties are all a filter can judge cheaply, which is what the properties policy stamps.
 */
public class RegionFilter implements EntryFilter {
    @Override
    public FilterResult filterEntry(Entry entry, FilterContext context) {
        Subscription subscription = context.getSubscription();
        MessageMetadata metadata = context.getMsgMetadata();
        if (subscription == null || metadata == null) {
            return FilterResult.ACCEPT;
        }
        Map<String, String> props = subscription.getSubscriptionProperties();
        String reject = props == null ? null : props.get("reject-region");
        if (reject == null) {
            return FilterResult.ACCEPT;
        }
        for (KeyValue kv : metadata.getPropertiesList()) {
            if ("region".equals(kv.getKey()) && reject.equals(kv.getValue())) {
                return FilterResult.REJECT;
            }
        }
        return FilterResult.ACCEPT;
    }

    @Override
    public void close() {
    }
}
